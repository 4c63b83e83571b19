"""train-head (issue 13): feature shards, the TTT loss, acceptance, checkpoint/resume, held-out
exclusion and input errors, on a tiny random Llama target (6 layers, V = 64, fp32)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.distill.helpers import word_tokenizer
from verispec.distill.data import save_shard
from verispec.distill.head_data import (
    build_record_features,
    build_text_features,
    feature_shard_paths,
    load_feature_shards,
    prompt_is_heldout,
)
from verispec.distill.head_train import (
    HeadTrainConfig,
    accumulate_loss_backward,
    acceptance_rows,
    evaluate_head,
    head_loss,
    init_from_target,
    make_window_batch,
    target_to_draft_table,
    teacher_in_draft,
    train_head,
)
from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, HeadConfig, load_head, target_features

V = 64


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return model


def records_for(prompt_ids, seed=0, length=24, prompt_len=6):
    generator = torch.Generator().manual_seed(seed)
    return [
        {"tokens": torch.randint(2, V, (length + i % 5,), generator=generator).to(torch.int32),
         "prompt_len": prompt_len, "target_start": prompt_len, "prompt_id": pid}
        for i, pid in enumerate(prompt_ids)
    ]


@pytest.fixture(scope="module")
def feature_dirs(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("head")
    save_shard(root / "records" / "shard-p00-b0000.pt", records_for([f"qa:{i}" for i in (1, 2, 3, 4, 6, 7)]))
    save_shard(root / "records" / "shard-p00-b0001.pt", records_for([f"coding:{i}" for i in (8, 9, 11, 12)], seed=1))
    # held-out prompts (Spec-Bench id % 5 == 0, HumanEval 0-39) mixed into a training directory
    save_shard(root / "records" / "shard-p01-b0000.pt",
               records_for(["qa:10", "humaneval:HumanEval/3", "humaneval:HumanEval/50", "qa:13"], seed=2))
    save_shard(root / "eval_records" / "eval-p00-b0000.pt", records_for(["qa:5", "qa:15", "humaneval:HumanEval/1"], seed=3))
    aux = HeadConfig.for_target(target.config, 32).aux_layer_ids
    counts = build_record_features(target, [root / "records"], root / "train", aux, top_k=16, progress=False)
    build_record_features(target, [root / "eval_records"], root / "eval", aux, top_k=16, allow_heldout=True, progress=False)
    return root, counts


def head_config(target, draft_vocab=32, **overrides):
    return HeadConfig.for_target(target.config, draft_vocab, **overrides)


def train_config(**overrides):
    values = dict(steps=6, batch_sequences=3, context=16, ttt_steps=3, lr=3e-3, warmup=2, eval_every=3,
                  checkpoint_every=100, checkpoint_minutes=1e9, log_every=1, seed=1)
    values.update(overrides)
    return HeadTrainConfig(**values)


def test_feature_shards_match_target_features(target, feature_dirs):
    root, _ = feature_dirs
    records = load_feature_shards(feature_shard_paths(root / "train"))
    aux = head_config(target).aux_layer_ids
    assert aux == (2, 3, 3)
    for record in records[:3]:
        features, logits = target_features(target, record["tokens"].long()[None], aux)
        torch.testing.assert_close(record["features"].float(), features[0], rtol=1e-3, atol=1e-3)
        assert record["features"].dtype == torch.float16
        values, ids = torch.topk(logits[0], 16, dim=-1)
        assert torch.equal(record["topk_ids"].long(), ids)
        torch.testing.assert_close(record["topk_logits"].float(), values, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(record["lse"], torch.logsumexp(logits[0], -1))
        torch.testing.assert_close(record["lse_eval"], torch.logsumexp(logits[0] / 0.6, -1))


def test_heldout_prompts_never_reach_training_features(feature_dirs):
    root, counts = feature_dirs
    assert counts["dropped_heldout"] == 2  # qa:10 and HumanEval/3; HumanEval/50 and qa:13 are training prompts
    ids = {r["prompt_id"] for r in load_feature_shards(feature_shard_paths(root / "train"))}
    assert "qa:10" not in ids and "humaneval:HumanEval/3" not in ids
    assert {"humaneval:HumanEval/50", "qa:13", "qa:1"} <= ids
    assert prompt_is_heldout("qa:5") and prompt_is_heldout("humaneval:HumanEval/39")
    assert not prompt_is_heldout("humaneval:HumanEval/40") and not prompt_is_heldout("text:/x.py#0")
    # a training shard that somehow holds a held-out prompt is refused when loaded for training
    with pytest.raises(ConfigError, match="held-out"):
        load_feature_shards(feature_shard_paths(root / "eval"))
    assert len(load_feature_shards(feature_shard_paths(root / "eval"), allow_heldout=True)) == 3


def test_text_files_cut_into_context_chunks(target, tmp_path):
    tokenizer = word_tokenizer(V)
    (tmp_path / "src").mkdir()
    for i in range(3):
        (tmp_path / "src" / f"m{i}.txt").write_text(" ".join(f"w{(7 * i + j) % (V - 2) + 2}" for j in range(40)))
    aux = head_config(target).aux_layer_ids
    counts = build_text_features(target, tokenizer, str(tmp_path / "src" / "*.txt"), tmp_path / "feat", aux,
                                 context=16, max_tokens=1000, shard_tokens=48, top_k=8, progress=False)
    records = load_feature_shards(feature_shard_paths(tmp_path / "feat"))
    expected = {}
    for i in range(3):
        ids = tokenizer.encode((tmp_path / "src" / f"m{i}.txt").read_text(), add_special_tokens=False)
        expected[str(tmp_path / "src" / f"m{i}.txt")] = [ids[s : s + 16] for s in range(0, len(ids) - 15, 16)]
    assert counts["records"] == len(records) == sum(len(c) for c in expected.values())  # short tails dropped
    for r in records:
        name, _, index = r["prompt_id"].removeprefix("text:").rpartition("#")
        assert r["tokens"].tolist() == expected[name][int(index)] and r["prompt_len"] == 0
    again = build_text_features(target, tokenizer, str(tmp_path / "src" / "*.txt"), tmp_path / "feat", aux,
                                context=16, max_tokens=1000, shard_tokens=48, top_k=8, progress=False)
    assert again["shards"] == 0  # resumable: existing shards are skipped


def test_acceptance_on_hand_made_distributions():
    draft_to_target = torch.tensor([0, 1, 2, 3])
    table = target_to_draft_table(draft_to_target, 6)
    temperature = 0.6
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.6, 0.4], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    logits = temperature * torch.log(p.clamp(min=1e-30))  # p = softmax(logits / T)
    ids = torch.arange(6).expand(3, 6)
    lse_eval = torch.logsumexp(logits / temperature, -1)
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25], [0.8, 0.1, 0.1, 0.0]])
    alpha, mass = acceptance_rows(ids, logits, lse_eval, q, table, temperature)
    torch.testing.assert_close(alpha, torch.tensor([1.0, 0.0, 0.6]))  # q = p; disjoint; min(.5,.8)+min(.5,.1)
    torch.testing.assert_close(mass, torch.tensor([1.0, 0.0, 1.0]))


def test_training_steps_lower_the_loss_on_a_fixed_batch(target, feature_dirs):
    root, _ = feature_dirs
    records = load_feature_shards(feature_shard_paths(root / "train"))[:4]
    embed = target.get_input_embeddings().weight.detach()
    torch.manual_seed(0)
    head = Eagle3Head(head_config(target), torch.arange(0, 64, 2))
    config = train_config(loss_temperature=1.0)
    table = target_to_draft_table(head.draft_to_target, V)
    batch = make_window_batch(records, [0, 1, 2, 3], 16, embed, "cpu")
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    first, first_steps = head_loss(head, batch, table, config)
    for _ in range(40):
        loss, _ = head_loss(head, batch, table, config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    last, last_steps = head_loss(head, batch, table, config)
    # the cross-entropy has the teacher's entropy as its floor: compare the excess (KL) at depth 1
    _, probs, has_mass = teacher_in_draft(batch["topk_ids"].flatten(0, 1), batch["topk_logits"].flatten(0, 1), table, 1.0)
    rows = batch["valid"].flatten() & has_mass
    p = probs[rows]
    entropy = float(-(p * torch.log(p.clamp(min=1e-30))).sum(-1).mean())
    assert last_steps[0] - entropy < 0.5 * (first_steps[0] - entropy)
    assert float(last.detach()) < float(first.detach())
    assert all(b < a for a, b in zip(first_steps, last_steps))  # every TTT depth improves


def test_unpadded_accumulation_equals_the_padded_batch_gradient(target, feature_dirs):
    root, _ = feature_dirs
    records = load_feature_shards(feature_shard_paths(root / "train"))[:3]
    embed = target.get_input_embeddings().weight.detach()
    torch.manual_seed(0)
    head = Eagle3Head(head_config(target), torch.arange(0, 64, 2)).double()
    config = train_config(context=26)
    table = target_to_draft_table(head.draft_to_target, V)
    starts = [0, 3, 1]
    batch = make_window_batch(records, starts, 26, embed.double(), "cpu")
    assert not bool(batch["valid"].all())  # the padded batch really holds padding
    loss, _ = head_loss(head, batch, table, config)
    loss.backward()
    expected = {n: p.grad.clone() for n, p in head.named_parameters()}
    head.zero_grad()
    total, _, entries = accumulate_loss_backward(head, list(zip(records, starts)), embed.double(), table, config)
    assert entries == int(batch["valid"].sum())
    assert abs(total - float(loss.detach())) < 1e-5  # the CE is taken in float32
    for name, param in head.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-7)


def test_resume_reproduces_an_uninterrupted_run(target, feature_dirs, tmp_path):
    root, _ = feature_dirs
    embed = target.get_input_embeddings().weight.detach()
    whole = train_head(tmp_path / "whole", [root / "train"], [root / "eval"], embed, head_config(target), train_config(),
                       progress=False)
    train_head(tmp_path / "split", [root / "train"], [root / "eval"], embed, head_config(target),
               train_config(stop_at=4), progress=False)
    assert not (tmp_path / "split" / "final").exists()
    resumed = train_head(tmp_path / "split", [root / "train"], [root / "eval"], embed, head_config(target), train_config(),
                         resume=True, progress=False)
    assert whole.step == resumed.step == 6
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)
    for name, tensor in a["head"].items():
        assert torch.equal(tensor, b["head"][name]), name
    for name, tensor in a["optimizer"]["state"][0].items():
        assert torch.equal(tensor, b["optimizer"]["state"][0][name])
    # best/ and final/ are loadable heads carrying the recipe; evaluation covers depths 1..4
    final = load_head(tmp_path / "whole" / "final")
    assert final.config.extra["training"]["step"] == 6
    assert final.config.extra["training"]["train_positions"] > 0
    assert load_head(tmp_path / "whole" / "best").config.draft_vocab_size == 32
    assert len(whole.last_eval.alpha) == 4 and all(0.0 <= a <= 1.0 for a in whole.last_eval.alpha)
    history = (tmp_path / "whole" / "history.jsonl").read_text().splitlines()
    assert sum('"eval"' in line for line in history) == 2  # steps 3 and 6


def test_draft_vocabulary_keeps_special_ids_and_is_sorted(target, feature_dirs, tmp_path):
    root, _ = feature_dirs
    embed = target.get_input_embeddings().weight.detach()
    train_head(tmp_path / "run", [root / "train"], [root / "eval"], embed, head_config(target, 8),
               train_config(steps=1, eval_every=1), always_ids=[0, 1], progress=False)
    ids = load_head(tmp_path / "run" / "final").draft_to_target
    assert len(ids) == 8 and 0 in ids.tolist() and 1 in ids.tolist()
    assert bool((ids[1:] > ids[:-1]).all())


def test_evaluation_of_a_perfect_copy_is_bounded_by_coverage(target, feature_dirs):
    """alpha <= teacher mass inside D for any head, with equality impossible beyond it."""
    root, _ = feature_dirs
    records = load_feature_shards(feature_shard_paths(root / "eval"), allow_heldout=True)
    torch.manual_seed(0)
    head = Eagle3Head(head_config(target, 16), torch.arange(16))
    result = evaluate_head(head, records, target.get_input_embeddings().weight.detach(), depths=4)
    assert result.entries > 0 and 0.0 < result.coverage < 1.0
    assert all(a <= result.coverage + 1e-6 for a in result.alpha[:1])
    assert math.isfinite(sum(result.alpha))


def test_bad_input_gives_clear_errors(target, feature_dirs, tmp_path):
    root, _ = feature_dirs
    embed = target.get_input_embeddings().weight.detach()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no training feature shards"):
        train_head(tmp_path / "a", [tmp_path / "empty"], [root / "eval"], embed, head_config(target), train_config(),
                   progress=False)
    with pytest.raises(ConfigError, match="held-out feature shards"):
        train_head(tmp_path / "b", [root / "train"], [tmp_path / "empty"], embed, head_config(target), train_config(),
                   progress=False)
    with pytest.raises(ConfigError, match="not found"):
        train_head(tmp_path / "c", [root / "train"], [tmp_path / "missing"], embed, head_config(target), train_config(),
                   progress=False)
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        head_config(target, V + 1)
    with pytest.raises(ConfigError, match="no record shard"):
        build_record_features(target, [tmp_path / "empty"], tmp_path / "out", (2, 3, 3), progress=False)
    with pytest.raises(ConfigError, match="--resume"):
        train_head(tmp_path / "d", [root / "train"], [root / "eval"], embed, head_config(target), train_config(),
                   resume=True, progress=False)


def test_cli_builds_features_and_trains(target, tmp_path):
    """`verispec train-head` end to end on a saved tiny target: records + text -> features -> head."""
    import json as json_module

    from tests.distill.helpers import save_pair_member
    from verispec.cli.main import main

    model_dir = save_pair_member(target, word_tokenizer(V), tmp_path / "target")
    save_shard(tmp_path / "records" / "shard-p00-b0000.pt", records_for(["qa:1", "qa:2", "qa:5"]))
    save_shard(tmp_path / "eval_records" / "eval-p00-b0000.pt", records_for(["qa:10", "qa:20"], seed=4))
    (tmp_path / "text.txt").write_text(" ".join(f"w{j % 60 + 2}" for j in range(100)))
    code = main(["train-head", "--out", str(tmp_path / "run"), "--target", str(model_dir),
                 "--records", str(tmp_path / "records"), "--eval-records", str(tmp_path / "eval_records"),
                 "--text-files", str(tmp_path / "*.txt"), "--draft-vocab", "24", "--steps", "2", "--batch", "2",
                 "--context", "32", "--eval-every", "1", "--top-k", "8", "--no-progress"])
    assert code == 0
    train_ids = {r["prompt_id"] for r in load_feature_shards(feature_shard_paths(tmp_path / "run" / "features" / "train"))}
    assert {"qa:1", "qa:2"} <= train_ids and "qa:5" not in train_ids  # qa:5 is held out
    assert any(i.startswith("text:") for i in train_ids)
    recipe = load_head(tmp_path / "run" / "final").config.extra["training"]
    assert recipe["step"] == 2 and recipe["heldout_eval"]["entries"] > 0
    assert json_module.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[-1])["eval"]["alpha"]
    assert main(["train-head", "--out", str(tmp_path / "bad"), "--target", str(model_dir), "--no-build",
                 "--draft-vocab", str(V + 1)]) == 2  # a clear ConfigError, not a traceback


def test_init_from_target_copies_the_output_rows_of_the_draft_vocabulary(target):
    head = Eagle3Head(head_config(target, 8), torch.tensor([1, 3, 5, 7, 11, 13, 17, 19]))
    out = target.get_output_embeddings().weight.detach()
    init_from_target(head, out, target.model.norm.weight.detach())
    assert torch.equal(head.lm_head.weight, out[[1, 3, 5, 7, 11, 13, 17, 19]])
    # the head then scores a target hidden state h exactly like the target does on D
    h = torch.randn(16)
    expected = target.lm_head(target.model.norm(h[None]))[0][head.draft_to_target]
    torch.testing.assert_close(head.draft_logits(h[None])[0], expected)
    with pytest.raises(ConfigError, match="does not match"):
        init_from_target(head, out[:, :8], target.model.norm.weight.detach())

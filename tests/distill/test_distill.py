"""Distillation on tiny models: data records, the sub-vocabulary draft, KL goes down, resume."""

import pytest
import torch

from tests.distill.helpers import save_pair_member, tiny_llama, word_tokenizer
from verispec.cli.main import main
from verispec.distill.data import build_dataset, load_shards, sub_vocabulary, teacher_forced_records
from verispec.distill.student import build_student, freeze_embedding
from verispec.distill.train import TrainConfig, evaluate, export_draft, train
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import load_model
from verispec.models.default_draft import SubVocabLlamaForCausalLM
from verispec.models.hf import HFModelAdapter

VOCAB = 40


def _prompts(count, length=6):
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(2, VOCAB, (length,), generator=generator).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target = tiny_llama(0, vocab_size=VOCAB, layers=2)
    build_dataset(target, None, _prompts(16), root / "train", max_new_tokens=10, batch_size=8, top_k=12, progress=False)
    build_dataset(target, None, _prompts(4, 5), root / "eval", prefix="eval", max_new_tokens=10, batch_size=4,
                  top_k=12, temperatures=(0.6,), seed=3, progress=False)
    return target, root


def test_records_hold_the_targets_distributions(tiny_data):
    target, root = tiny_data
    records = load_shards(root / "train")
    assert len(records) == 16
    record = records[0]
    n_new = len(record["tokens"]) - record["prompt_len"]
    assert record["topk_ids"].shape == (n_new, 12) and n_new == 10
    with torch.no_grad():
        logits = target(record["tokens"][None, :-1].long()).logits[0, record["prompt_len"] - 1 :]
    probs = torch.softmax(logits.float(), -1)
    stored = torch.exp(record["topk_logits"].float() - record["lse"][:, None])
    torch.testing.assert_close(stored, probs.gather(-1, record["topk_ids"].long()), atol=2e-3, rtol=1e-2)
    # teacher-forced rows over every position from 1 reproduce the continuation rows at the end
    full = teacher_forced_records(target, [record], top_k=12)[0]
    assert full["target_start"] == 1 and full["topk_ids"].shape[0] == len(record["tokens"]) - 1
    torch.testing.assert_close(full["lse"][-n_new:], record["lse"], atol=1e-4, rtol=1e-4)


def test_sub_vocabulary_draft_saves_loads_and_decodes(tiny_data, tmp_path):
    target, root = tiny_data
    records = load_shards(root / "train")
    sub_ids = sub_vocabulary(records, VOCAB, 24, always=[0, 1])
    assert len(sub_ids) == 24 and {0, 1} <= set(sub_ids.tolist())
    student = build_student(target, hidden=16, layers=1, sub_vocab_ids=sub_ids)
    tokenizer = word_tokenizer(VOCAB)
    export_draft(student, tmp_path / "draft", tokenizer, dtype=torch.float32)
    loaded, loaded_tokenizer = load_model(tmp_path / "draft")
    assert isinstance(loaded, SubVocabLlamaForCausalLM) and loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        logits = loaded(ids).logits[0]
        torch.testing.assert_close(logits, student(ids).logits[0])
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[sub_ids] = False
    assert torch.isneginf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()
    assert HFModelAdapter(loaded).vocab_size == VOCAB
    # lossless decoding with a q = 0 region stays exact: greedy speculative output = greedy target output
    greedy = SpeculativeDecoder(target, method="ar", temperature=0, max_new_tokens=12).generate([3, 5, 7]).token_ids
    spec = SpeculativeDecoder(target, loaded, method="sd", draft_len=3, temperature=0, max_new_tokens=12).generate([3, 5, 7])
    assert spec.token_ids == greedy


def test_a_few_steps_lower_the_kl(tiny_data, tmp_path):
    target, root = tiny_data
    eval_records = load_shards(root / "eval", "eval-*.pt")
    student = build_student(target, hidden=16, layers=1, sub_vocab_ids=sub_vocabulary(load_shards(root / "train"), VOCAB, 32))
    freeze_embedding(student)
    before = evaluate(student, eval_records)
    config = TrainConfig(steps=30, batch_sequences=4, lr=2e-2, warmup=3, eval_every=10, checkpoint_every=10)
    state = train(student, root / "train", eval_records, tmp_path / "run", config, progress=False)
    after = evaluate(student, eval_records)
    assert state.step == 30 and state.positions_seen == 30 * 4 * 10
    assert after["kl"] < 0.9 * before["kl"]
    assert [h["step"] for h in state.history] == [0, 10, 20, 30]
    assert (tmp_path / "run" / "best" / "config.json").is_file() and (tmp_path / "run" / "final" / "config.json").is_file()


def test_resume_continues_exactly(tiny_data, tmp_path):
    target, root = tiny_data
    eval_records = load_shards(root / "eval", "eval-*.pt")

    def fresh():
        student = build_student(target, hidden=16, layers=1, sub_vocab_ids=torch.arange(30), seed=1)
        freeze_embedding(student)
        return student

    config = TrainConfig(steps=8, batch_sequences=3, lr=3e-3, warmup=2, eval_every=4, checkpoint_every=4)
    straight = fresh()
    train(straight, root / "train", eval_records, tmp_path / "straight", config, progress=False)

    interrupted = fresh()
    train(interrupted, root / "train", eval_records, tmp_path / "split", TrainConfig(**{**config.__dict__, "stop_at": 5}), progress=False)
    resumed = fresh()  # a new process: weights come from the checkpoint
    state = train(resumed, root / "train", eval_records, tmp_path / "split", config, resume=True, progress=False)
    assert state.step == 8
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name, atol=1e-6, rtol=1e-5)


def test_cli_distill_end_to_end(tmp_path):
    tokenizer = word_tokenizer(VOCAB)
    target = save_pair_member(tiny_llama(0, vocab_size=VOCAB), tokenizer, tmp_path / "target")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(f"w{t}" for t in p) for p in _prompts(8)))
    run = tmp_path / "run"
    common = ["distill", "--out", str(run), "--target", str(target), "--prompts", str(prompts), "--max-new-tokens", "8",
              "--gen-batch", "4", "--hidden", "16", "--layers", "1", "--sub-vocab", "24", "--batch-size", "4",
              "--eval-every", "5", "--checkpoint-every", "5", "--teacher-dtype", "fp32", "--prompt-positions"]
    assert main([*common, "--steps", "5"]) == 0
    assert main([*common, "--steps", "10", "--resume"]) == 0
    history = [line for line in (run / "history.jsonl").read_text().splitlines() if '"alpha"' in line]
    assert len(history) >= 3
    draft, _ = load_model(run / "final")
    assert draft.lm_head.weight.shape == (24, 16)

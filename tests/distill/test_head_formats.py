"""EAGLE-3 head interop: export/load round trips (eagle3, speculators), the documented config keys
and tensor names, published-style checkpoints, clear errors, and `draft check` on a head."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.distill.helpers import save_pair_member, tiny_llama, word_tokenizer
from verispec.cli.main import main
from verispec.core.sampling import SamplingParams
from verispec.distill import head_check
from verispec.models import head_formats as head_export
from verispec.models.head_formats import export_head, head_format, load_any_head, resolve_head_dir
from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, HeadConfig, save_head, target_features

V, D, H, HT = 50, 20, 16, 12
DRAFT_IDS = torch.tensor(sorted({0, 1, 3, 4, 7, 9, 10, 12, 15, 18, 21, 22, 25, 30, 31, 33, 40, 41, 47, 49}))


def tiny_config(**overrides):
    values = dict(hidden_size=H, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                  vocab_size=V, draft_vocab_size=D, target_hidden_size=HT, aux_layer_ids=(2, 3, 4), rope_theta=100.0,
                  rms_norm_eps=1e-5, max_position_embeddings=256, extra={"target": "tiny", "steps": 3})
    values.update(overrides)
    return HeadConfig(**values)


def tiny_head(seed=0, draft_ids=DRAFT_IDS, **overrides):
    torch.manual_seed(seed)
    head = Eagle3Head(tiny_config(**overrides), draft_ids)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


def target_config(vocab=V, hidden=HT, layers=6):
    return SimpleNamespace(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers)


def assert_same_head(a: Eagle3Head, b: Eagle3Head):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name
    assert torch.equal(a.d2t, b.d2t) and torch.equal(a.t2d, b.t2d)
    assert a.config == b.config


# ------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_export_then_load_round_trips_bit_exactly(tmp_path, fmt, norm_before_residual):
    head = tiny_head(norm_before_residual=norm_before_residual)
    if fmt == "eagle3" and norm_before_residual:
        with pytest.warns(UserWarning, match="may ignore it"):
            out = export_head(head, tmp_path / fmt, fmt, verifier_name_or_path="tiny/target", speculative_tokens=4)
    else:
        out = export_head(head, tmp_path / fmt, fmt, verifier_name_or_path="tiny/target", speculative_tokens=4)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert head_format(out) == fmt
    assert_same_head(head, load_any_head(out, target_config()))
    assert_same_head(head, load_any_head(out))  # the ids are in the file: no target needed


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_bf16_export_round_trips_bit_exactly(tmp_path, fmt):
    head = tiny_head()
    export_head(head, tmp_path, fmt, dtype=torch.bfloat16)
    assert load_file(str(tmp_path / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert_same_head(head.to(torch.bfloat16), load_any_head(tmp_path, dtype=torch.bfloat16))


def test_native_round_trip_through_load_any_head(tmp_path):
    head = tiny_head()
    save_head(head, tmp_path)
    assert head_format(tmp_path) == "native"
    assert_same_head(head, load_any_head(tmp_path))


# --------------------------------------------------------------- documented keys, names
def test_eagle3_config_and_tensor_names(tmp_path):
    head = tiny_head()
    export_head(head, tmp_path, "eagle3")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1
    assert config["vocab_size"] == V
    assert config["draft_vocab_size"] == D
    assert config["hidden_size"] == H
    assert config["target_hidden_size"] == HT
    assert config["intermediate_size"] == 32
    assert config["num_attention_heads"] == 4
    assert config["num_key_value_heads"] == 2
    assert config["head_dim"] == 4
    assert config["hidden_act"] == "silu"
    assert config["rms_norm_eps"] == 1e-5
    assert config["rope_theta"] == 100.0
    assert config["rope_scaling"] is None
    assert config["tie_word_embeddings"] is False
    # SGLang captures layer_ids + 1: its ids count layer outputs, verispec's (2, 3, 4) count inputs
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["eagle_config"]["use_aux_hidden_state"] is True
    assert config["norm_before_residual"] is False
    assert config["torch_dtype"] == "float32"
    assert config["verispec_extra"] == {"target": "tiny", "steps": 3}

    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert set(tensors) == {
        "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
        "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
        "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
        "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
        "midlayer.mlp.down_proj.weight",
    }
    assert tensors["fc.weight"].shape == (H, 3 * HT)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (16, 2 * H)
    assert tensors["lm_head.weight"].shape == (D, H)
    assert tensors["d2t"].dtype == torch.int64 and tensors["d2t"].shape == (D,)
    assert torch.equal(tensors["d2t"] + torch.arange(D), DRAFT_IDS)  # target id = d + d2t[d]
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].shape == (V,)
    assert tensors["t2d"].nonzero().flatten().tolist() == DRAFT_IDS.tolist()


def test_speculators_config_and_tensor_names(tmp_path):
    head = tiny_head(norm_before_residual=True)
    export_head(head, tmp_path, "speculators", verifier_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
                speculative_tokens=5)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["architectures"] == ["Eagle3Speculator"]
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama"
    assert layer["vocab_size"] == V
    assert layer["hidden_size"] == H
    assert layer["num_hidden_layers"] == 1
    assert layer["num_attention_heads"] == 4
    assert layer["num_key_value_heads"] == 2
    assert layer["head_dim"] == 4
    assert layer["intermediate_size"] == 32
    assert layer["rope_theta"] == 100.0
    assert config["draft_vocab_size"] == D
    assert config["target_hidden_size"] == HT
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # vLLM: input of layer i, as verispec
    assert "norm_before_residual" in config and config["norm_before_residual"] is True
    assert config["norm_before_fc"] is False
    assert config["fc_norm"] is False and config["norm_output"] is False
    speculators = config["speculators_config"]
    assert speculators["algorithm"] == "eagle3"
    assert speculators["proposal_methods"][0]["speculative_tokens"] == 5
    assert speculators["proposal_methods"][0]["proposal_type"] == speculators["default_proposal_method"] == "greedy"
    assert speculators["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"

    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert not any(name.startswith("midlayer.") for name in tensors)
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.hidden_norm.weight", "layers.0.mlp.down_proj.weight",
            "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert len(tensors) == 15 and "embed_tokens.weight" not in tensors
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


# ------------------------------------------------------------ published-style checkpoints
def _published_eagle3(head: Eagle3Head, directory, embed: torch.Tensor):
    """A SpecForge/SGLang-style full-vocabulary checkpoint written by hand: documented names with
    a ``model.`` prefix on the midlayer, an embedding, no d2t / t2d, no layer ids, no draft_vocab_size."""
    directory.mkdir()
    tensors = {("model." + n if n.startswith("midlayer.") else n): t.clone() for n, t in head.state_dict().items()
               if n != "draft_to_target"}
    tensors["embed_tokens.weight"] = embed.clone()
    save_file(tensors, str(directory / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "vocab_size": V, "target_hidden_size": HT, "rms_norm_eps": 1e-5, "rope_theta": 100.0,
              "max_position_embeddings": 256, "hidden_act": "silu", "tie_word_embeddings": False}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_published_full_vocabulary_eagle3_checkpoint_computes_the_same_forward(tmp_path):
    reference = tiny_head(draft_ids=torch.arange(V), draft_vocab_size=V, aux_layer_ids=(2, 3, 3), extra={})
    embed = torch.randn(V, H)
    directory = _published_eagle3(reference, tmp_path / "published", embed)
    with pytest.raises(ConfigError, match="names no feature layer ids"):
        load_any_head(directory)
    loaded = load_any_head(directory, target_config(layers=6), target_embedding=embed)
    assert loaded.config.aux_layer_ids == (2, 3, 3)  # EAGLE-3's default for 6 layers: 2, N//2, N-3
    assert loaded.config.draft_vocab_size == V and loaded.t2d.all()
    features, embeds = torch.randn(1, 7, 3 * HT), torch.randn(1, 7, H)
    with torch.no_grad():
        for a, b in zip(reference.unrolled(features, embeds, 3), loaded.unrolled(features, embeds, 3)):
            assert torch.equal(a, b)
    with pytest.warns(UserWarning, match="embed_tokens differ"):
        load_any_head(directory, target_config(layers=6), target_embedding=embed + 1.0)


def test_published_speculators_checkpoint_with_unordered_d2t_gives_the_same_distribution(tmp_path):
    reference = tiny_head()
    permutation = torch.randperm(D, generator=torch.Generator().manual_seed(3))
    tensors = head_export.export_tensors(reference, "speculators")
    ids = DRAFT_IDS[permutation]  # a checkpoint listing its draft tokens in another order
    tensors["lm_head.weight"] = tensors["lm_head.weight"][permutation].clone()
    tensors["d2t"] = ids - torch.arange(D)
    tensors["embed_tokens.weight"] = torch.zeros(V, H)
    tensors["verifier_norm.weight"] = torch.ones(H)
    directory = tmp_path / "spec"
    directory.mkdir()
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(directory / "model.safetensors"))
    config = head_export.export_config(reference.config, "speculators", "tiny/target", 3)
    (directory / "config.json").write_text(json.dumps(config))
    loaded = load_any_head(directory, target_config())
    assert torch.equal(loaded.draft_to_target, DRAFT_IDS)
    out = torch.randn(5, H)
    with torch.no_grad():
        assert torch.equal(reference.target_logits(out), loaded.target_logits(out))


# ---------------------------------------------------------------------------- errors
def test_unknown_format_and_missing_files(tmp_path):
    head = tiny_head()
    with pytest.raises(ConfigError, match="unknown head format 'gguf'; choose one of eagle3, speculators"):
        export_head(head, tmp_path / "x", "gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no head checkpoint"):
        load_any_head(tmp_path / "empty")
    export_head(head, tmp_path / "noweights", "eagle3")
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no weights"):
        load_any_head(tmp_path / "noweights")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_head_dir(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="neither a head directory"):
        resolve_head_dir(tmp_path / "empty")


def test_a_training_run_directory_resolves_to_best_then_final(tmp_path):
    save_head(tiny_head(), tmp_path / "run" / "final")
    assert resolve_head_dir(tmp_path / "run") == tmp_path / "run" / "final"
    save_head(tiny_head(1), tmp_path / "run" / "best")
    assert resolve_head_dir(tmp_path / "run") == tmp_path / "run" / "best"


def test_vocabulary_width_and_layer_mismatches_with_the_target(tmp_path):
    export_head(tiny_head(), tmp_path, "speculators")
    with pytest.raises(ConfigError, match="head vocabulary 50 != target vocabulary 64"):
        load_any_head(tmp_path, target_config(vocab=64))
    with pytest.raises(ConfigError, match="width 12, the target's hidden size is 24"):
        load_any_head(tmp_path, target_config(hidden=24))
    with pytest.raises(ConfigError, match=r"include \[4\], outside the target's layer inputs \[0, 3\]"):
        load_any_head(tmp_path, target_config(layers=4))


def _rewrite_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_unsupported_published_settings_are_refused(tmp_path):
    head = tiny_head()
    export_head(head, tmp_path / "e", "eagle3")
    _rewrite_config(tmp_path / "e", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ConfigError, match="rope scaling .*llama3.* is not supported"):
        load_any_head(tmp_path / "e")
    _rewrite_config(tmp_path / "e", rope_scaling={"rope_type": "default", "rope_theta": 100.0}, num_hidden_layers=2)
    with pytest.raises(ConfigError, match="2 decoder layers"):
        load_any_head(tmp_path / "e")

    export_head(head, tmp_path / "s", "speculators")
    _rewrite_config(tmp_path / "s", norm_before_residual=None)
    with pytest.raises(ConfigError, match="norm_before_residual is absent"):
        load_any_head(tmp_path / "s")
    _rewrite_config(tmp_path / "s", norm_before_residual=False, norm_before_fc=True)
    with pytest.raises(ConfigError, match="norm_before_fc"):
        load_any_head(tmp_path / "s")
    _rewrite_config(tmp_path / "s", norm_before_fc=False, fc_norm=True)
    with pytest.raises(ConfigError, match="fc_norm = true"):
        load_any_head(tmp_path / "s")
    _rewrite_config(tmp_path / "s", fc_norm=False, draft_vocab_size=D + 1)
    with pytest.raises(ConfigError, match="d2t must be integer offsets of shape \\(21,\\)"):
        load_any_head(tmp_path / "s")

    tensors = load_file(str(tmp_path / "e" / "model.safetensors"))
    _rewrite_config(tmp_path / "e", num_hidden_layers=1)
    bad_t2d = tensors["t2d"].clone()
    bad_t2d[2] = True
    save_file({**tensors, "t2d": bad_t2d}, str(tmp_path / "e" / "model.safetensors"))
    with pytest.raises(ConfigError, match="t2d does not mark exactly"):
        load_any_head(tmp_path / "e")
    del tensors["norm.weight"]
    save_file(tensors, str(tmp_path / "e" / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing \['norm.weight'\]"):
        load_any_head(tmp_path / "e")


# ---------------------------------------------------------------------------- the CLI
def test_cli_export_head_writes_both_formats_and_refuses_what_is_missing(tmp_path, capsys, monkeypatch):
    head = tiny_head()
    save_head(head, tmp_path / "run" / "best")
    for fmt in ("eagle3", "speculators"):
        out = tmp_path / f"out-{fmt}"
        assert main(["export-head", str(tmp_path / "run"), "--format", fmt, "--out", str(out),
                     "--speculative-tokens", "4"]) == 0
        assert_same_head(head, load_any_head(out))
    assert json.loads((tmp_path / "out-speculators" / "config.json").read_text())[
        "speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    capsys.readouterr()
    assert main(["export-head", str(tmp_path / "nothing"), "--format", "eagle3", "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    monkeypatch.setattr(head_export, "SHIPPED_HEAD_DIR", tmp_path / "no-assets")
    assert main(["export-head", "head", "--format", "eagle3", "--out", str(tmp_path / "o")]) == 2
    assert "ships no trained head" in capsys.readouterr().err


# ------------------------------------------------------------------------ draft check
def _tiny_pair(tmp_path, vocab=12):
    """A 5-layer tiny Llama target with a word tokenizer, and a random head reading its layer
    inputs 1, 2, 4 over a draft vocabulary of 8 of its 12 tokens."""
    target = tiny_llama(0, vocab_size=vocab, layers=5).eval()
    target_dir = save_pair_member(target, word_tokenizer(vocab), tmp_path / "target")
    config = HeadConfig.for_target(target.config, draft_vocab_size=8, aux_layer_ids=(1, 2, 4))
    torch.manual_seed(1)
    head = Eagle3Head(config, torch.tensor([0, 1, 2, 3, 5, 7, 9, 11]))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return target, head.eval(), target_dir


def test_head_alpha_matches_a_decode_time_computation(tmp_path):
    target, head, _ = _tiny_pair(tmp_path)
    tokens, prompt_len = [1, 4, 2, 7, 7, 3, 9, 5, 6, 2], 4
    params = SamplingParams(0.6)
    measured = head_check.head_alpha_per_depth(target, head, [(tokens, prompt_len)], params, params, depths=2)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        features, logits = target_features(target, ids, head.config.aux_layer_ids)
        embeds = target.get_input_embeddings()(ids[:, 1:])
        expected = {1: [], 2: []}
        for i in range(prompt_len, len(tokens)):  # predict token i
            p = torch.softmax(logits[0, i - 1].double() / 0.6, -1)
            # depth 1: committed x_0..x_{i-2}, pending root x_{i-1}: entries 0..i-2, the last is the query
            first = head.step(head.project(features[:, : i - 1]), embeds[:, : i - 1], torch.arange(i - 1)[None])
            q1 = torch.softmax(head.target_logits(first.out[0, -1]).double() / 0.6, -1)
            expected[1].append(torch.minimum(p, q1).sum().item())
            # depth 2: a round rooted one token earlier whose depth-1 draft was x_{i-1}
            if i - 2 >= 1:
                root = head.step(head.project(features[:, : i - 2]), embeds[:, : i - 2], torch.arange(i - 2)[None])
                second = head.step(root.out[:, -1:], embeds[:, i - 2 : i - 1], torch.tensor([[i - 2]]),
                                   root.keys, root.values)
                q2 = torch.softmax(head.target_logits(second.out[0, -1]).double() / 0.6, -1)
                expected[2].append(torch.minimum(p, q2).sum().item())
    assert measured.positions_per_depth == [len(expected[1]), len(expected[2])] == [6, 6]
    assert measured.alpha_per_depth[0] == pytest.approx(sum(expected[1]) / 6, abs=1e-5)
    assert measured.alpha_per_depth[1] == pytest.approx(sum(expected[2]) / 6, abs=1e-5)
    assert measured.alpha_per_depth[0] != pytest.approx(measured.alpha_per_depth[1], abs=1e-4)


def test_rrs_acceptance_matches_the_closed_form_test_vector():
    p, q = np.array([[0.1, 0.6, 0.3]]), np.array([[0.5, 0.3, 0.2]])
    assert head_check.rrs_acceptance(p, q, 1)[0] == pytest.approx(0.6)  # sum min(p, q)
    assert head_check.rrs_acceptance(p, q, 2)[0] == pytest.approx(0.80)  # ALGORITHMS.md §8.1 / §14.4
    assert head_check.rrs_acceptance(q, q, 4)[0] == pytest.approx(1.0)


def test_tree_predictions():
    alphas = {1: [0.8, 0.5, 0.4], 2: [0.9, 0.7, 0.6], 4: [0.95, 0.8, 0.7]}
    rows = {tuple(r["shape"]): r for r in head_check.tree_predictions(alphas, 0.1)}
    assert (2, 1, 1, 1) not in rows  # deeper than measured
    two_two = rows[(2, 2)]
    assert two_two["nodes"] == 6 and two_two["head_rows"] == 3
    assert two_two["block_efficiency"] == pytest.approx(1 + 0.9 + 0.9 * 0.7)
    assert two_two["speedup"] == pytest.approx((1 + 0.9 + 0.9 * 0.7) / 1.3)
    four_two_one = rows[(4, 2, 1)]
    assert four_two_one["head_rows"] == 1 + 4 + 8 and four_two_one["nodes"] == 4 + 8 + 8
    assert four_two_one["block_efficiency"] == pytest.approx(1 + 0.95 + 0.95 * 0.7 + 0.95 * 0.7 * 0.4)


def test_chain_predictions():
    rows = head_check.chain_predictions([0.8, 0.5, 0.5], 0.1)
    assert [r["L"] for r in rows] == [1, 2, 3]
    assert [r["block_efficiency"] for r in rows] == pytest.approx([1.8, 2.2, 2.4])
    assert rows[2]["speedup"] == pytest.approx(2.4 / 1.3)


def _prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("w3 w4 w5\nw6 w7\nw2 w9 w4 w4\n")
    return path


@pytest.mark.parametrize("fmt", ["native", "speculators"])
def test_cli_draft_check_on_a_tiny_head(tmp_path, capsys, fmt):
    _, head, target_dir = _tiny_pair(tmp_path)
    head_dir = tmp_path / "head"
    save_head(head, head_dir) if fmt == "native" else export_head(head, head_dir, fmt)
    code = main(["draft", "check", "--target", str(target_dir), "--draft", str(head_dir), "--prompts",
                 str(_prompt_file(tmp_path)), "--num-prompts", "3", "--max-new-tokens", "8", "--timing-steps", "3",
                 "--timing-context", "20", "--dtype", "fp32", "--temperature", "0.6", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("alpha", "alpha_per_depth", "cost_ratio", "best_L", "predicted_speedup", "verdict", "by_L",
                "positions_per_depth", "draft_vocab_mass", "target_ms_per_token", "draft_ms_per_token"):
        assert key in report, key
    assert report["head_format"] == fmt and report["vocab_compatible"] is True
    depths = report["alpha_per_depth"]
    assert len(depths) == 4 and all(0.0 <= a <= 1.0 for a in depths)
    assert report["alpha"] == depths[0]
    assert isinstance(report["alpha_std_over_sequences"], float) and len(report["alpha_std_per_depth"]) == 4
    counts = report["positions_per_depth"]
    assert counts[0] == report["positions"] > 0 and all(a >= b for a, b in zip(counts, counts[1:]))
    assert 0.0 < report["draft_vocab_mass"] <= 1.0 + 1e-9
    assert report["cost_ratio"] > 0 and report["draft_ms_per_token"] > 0
    assert [row["L"] for row in report["by_L"]] == [1, 2, 3, 4]
    assert report["by_L"][0]["block_efficiency"] == pytest.approx(1 + depths[0])
    assert report["by_L"][1]["block_efficiency"] == pytest.approx(1 + depths[0] + depths[0] * depths[1])
    best = report["by_L"][report["best_L"] - 1]
    assert report["predicted_speedup"] == best["speedup"] == max(r["speedup"] for r in report["by_L"])
    assert report["verdict"] in ("good", "marginal", "not worth it")
    rrs = report["rrs_alpha_per_depth"]
    assert sorted(rrs) == ["1", "2", "4"] and rrs["1"] == depths
    assert all(a <= b + 1e-12 <= c + 2e-12 for a, b, c in zip(rrs["1"], rrs["2"], rrs["4"]))
    assert [tuple(r["shape"]) for r in report["by_tree"]] == [tuple(s) for s in head_check.TREE_SHAPES]


def test_cli_draft_check_refuses_a_head_for_another_vocabulary(tmp_path, capsys):
    _, head, _ = _tiny_pair(tmp_path)
    other = save_pair_member(tiny_llama(2, vocab_size=14, layers=5), word_tokenizer(14), tmp_path / "other")
    save_head(head, tmp_path / "head")
    code = main(["draft", "check", "--target", str(other), "--draft", str(tmp_path / "head"), "--prompts",
                 str(_prompt_file(tmp_path)), "--dtype", "fp32", "--json"])
    assert code == 2
    assert "head vocabulary 12 != target vocabulary 14" in capsys.readouterr().err


def test_cli_draft_check_head_without_a_shipped_head(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(head_export, "SHIPPED_HEAD_DIR", tmp_path / "no-assets")
    assert main(["draft", "check", "--draft", "head", "--json"]) == 2
    assert "ships no trained head" in capsys.readouterr().err


def test_cli_export_of_a_head_without_layer_ids_needs_the_target(tmp_path, capsys):
    _, head, target_dir = _tiny_pair(tmp_path)
    export_head(head, tmp_path / "published", "eagle3")
    _rewrite_config(tmp_path / "published", eagle_config=None)  # as published heads that rely on the default
    out = tmp_path / "out"
    assert main(["export-head", str(tmp_path / "published"), "--format", "speculators", "--out", str(out)]) == 2
    assert "names no feature layer ids" in capsys.readouterr().err
    assert main(["export-head", str(tmp_path / "published"), "--format", "speculators", "--out", str(out),
                 "--target", str(target_dir)]) == 0
    assert load_any_head(out).config.aux_layer_ids == (2, 2, 2)  # EAGLE-3's default for 5 layers
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 2, 2]


def test_draft_temperature_refuses_a_head_clearly(tmp_path, capsys):
    save_head(tiny_head(), tmp_path / "head")
    assert main(["draft", "temperature", "--draft", str(tmp_path / "head")]) == 2
    assert "does not sweep EAGLE-3 heads" in capsys.readouterr().err


def test_exported_configs_parse_as_transformers_llama_configs(tmp_path):
    """SGLang reads the eagle3 config.json with transformers' AutoConfig (model_type llama); vLLM
    builds a LlamaConfig from the speculators transformer_layer_config."""
    from transformers import AutoConfig, LlamaConfig

    head = tiny_head()
    export_head(head, tmp_path / "e", "eagle3")
    config = AutoConfig.from_pretrained(tmp_path / "e")
    assert isinstance(config, LlamaConfig) and config.architectures == ["LlamaForCausalLMEagle3"]
    assert config.draft_vocab_size == D and config.vocab_size == V and config.head_dim == 4
    assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config.num_key_value_heads == 2 and config.target_hidden_size == HT

    export_head(head, tmp_path / "s", "speculators")
    layer = LlamaConfig(**json.loads((tmp_path / "s" / "config.json").read_text())["transformer_layer_config"])
    assert layer.hidden_size == H and layer.vocab_size == V and layer.num_hidden_layers == 1


def test_load_head_for_target_resolves_checks_and_matches_the_target(tmp_path, monkeypatch):
    target, head, _ = _tiny_pair(tmp_path)
    export_head(head, tmp_path / "run" / "final", "speculators")
    loaded = head_export.load_head_for_target(tmp_path / "run", target.to(torch.float64))
    assert next(loaded.parameters()).dtype == torch.float64
    assert_same_head(head.double(), loaded)
    monkeypatch.setattr(head_export, "SHIPPED_HEAD_DIR", tmp_path / "run" / "final")
    assert_same_head(head.double(), head_export.load_head_for_target("head", target))
    other = tiny_llama(2, vocab_size=14, layers=5)
    with pytest.raises(ConfigError, match="head vocabulary 12 != target vocabulary 14"):
        head_export.load_head_for_target(tmp_path / "run", other)

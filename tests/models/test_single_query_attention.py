"""models.attention.single_query_attention: one query row's attention as two float32 products, the
path a reduced-precision CPU decoding step takes instead of torch's slow single-row flash kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from verispec.models import attention, native_llama
from verispec.models.attention import single_query_attention, takes_single_query_path
from verispec.models.hf import HFModelAdapter

from .test_native_llama import llama, reference


def operands(heads=6, kv_heads=2, keys=37, head_dim=16, dtype=torch.float64, seed=0):
    """A query row and a cache whose kv heads differ (a wrong head grouping changes the result)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, 1, head_dim, generator=generator, dtype=torch.float64) * 2
    # keys stored with spare capacity after them, as in the KV buffers: a strided view
    cache_keys = torch.randn(1, kv_heads, keys + 5, head_dim, generator=generator, dtype=torch.float64) * 2
    cache_values = torch.randn(1, kv_heads, keys + 5, head_dim, generator=generator, dtype=torch.float64)
    return query.to(dtype), cache_keys[:, :, :keys].to(dtype), cache_values[:, :, :keys].to(dtype)


def sdpa_reference(query, keys, values, scale, allowed=None):
    """torch's own attention in float64 (kv head h // group for query head h)."""
    mask = None if allowed is None else allowed.reshape(1, 1, 1, -1)
    return F.scaled_dot_product_attention(query.double(), keys.double(), values.double(), attn_mask=mask,
                                          scale=scale, enable_gqa=True)


@pytest.mark.parametrize("heads, kv_heads", [(6, 2), (4, 4), (9, 3)])
def test_equals_torch_attention_in_float64(heads, kv_heads):
    query, keys, values = operands(heads, kv_heads)
    out = single_query_attention(query, keys, values, scale=0.3)
    assert out.shape == (1, heads, 1, query.shape[-1]) and out.dtype == query.dtype
    torch.testing.assert_close(out, sdpa_reference(query, keys, values, 0.3), atol=1e-12, rtol=0)


def test_mask_hides_keys():
    query, keys, values = operands()
    allowed = torch.rand(keys.shape[2], generator=torch.Generator().manual_seed(3)) < 0.4
    allowed[0] = True
    out = single_query_attention(query, keys, values, scale=0.25, allowed=allowed)
    torch.testing.assert_close(out, sdpa_reference(query, keys, values, 0.25, allowed), atol=1e-12, rtol=0)
    assert not torch.allclose(out, single_query_attention(query, keys, values, scale=0.25), atol=1e-3)


def test_bf16_within_one_rounding_of_the_exact_result():
    """Accumulated in float32 and rounded once: no further from the float64 result than torch's
    own bf16 kernel is, and within bf16's half-ulp of it."""
    query, keys, values = operands(heads=9, kv_heads=3, keys=300, head_dim=64, dtype=torch.bfloat16)
    exact = sdpa_reference(query, keys, values, 0.125)
    ours = single_query_attention(query, keys, values, scale=0.125).double()
    torchs = F.scaled_dot_product_attention(query, keys, values, scale=0.125, enable_gqa=True).double()
    assert (ours - exact).abs().max() <= max(2 * (torchs - exact).abs().max().item(), 1e-6)
    assert ((ours - exact).abs() <= exact.abs() * 2 ** -8 + 1e-6).all()


def test_only_reduced_precision_single_cpu_rows_take_the_path():
    cpu = torch.device("cpu")
    assert takes_single_query_path(1, torch.bfloat16, cpu) and takes_single_query_path(1, torch.float16, "cpu")
    assert not takes_single_query_path(1, torch.float32, cpu)  # float32 keeps the flash kernel (same speed, same bits as before)
    assert not takes_single_query_path(2, torch.bfloat16, cpu)  # two rows
    assert not takes_single_query_path(1, torch.bfloat16, torch.device("meta"))  # not a CPU


def test_bf16_decoding_step_uses_the_path_and_keeps_the_logits(monkeypatch):
    """A bf16 single-token step of the native runner goes through the float32 products, and its
    logits equal the flash kernel's to bf16 rounding and a float32 model's to the bf16 tolerance."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return single_query_attention(*args, **kwargs)

    model = llama(hidden_size=96, intermediate_size=128, num_attention_heads=6, num_key_value_heads=2)
    exact = reference(model, [5, 17, 3, 9, 30, 2, 11])
    model = model.to(torch.bfloat16)
    monkeypatch.setattr(native_llama, "single_query_attention", counting)
    adapter = HFModelAdapter(model, backend="native")
    adapter.reset([5, 17, 3, 9, 30, 2, 11])
    ours = adapter.extend([-1], [-1])[0]
    assert len(calls) == model.config.num_hidden_layers
    adapter.runner.single_query_path = False
    adapter.reset([5, 17, 3, 9, 30, 2, 11])
    flash = adapter.extend([-1], [-1])[0]
    assert len(calls) == model.config.num_hidden_layers  # the switch really turned the path off
    torch.testing.assert_close(ours, flash, atol=0.05, rtol=0)
    torch.testing.assert_close(ours, exact, atol=0.1, rtol=0)


def test_float32_decoding_step_keeps_the_flash_kernel(monkeypatch):
    monkeypatch.setattr(native_llama, "single_query_attention", lambda *a, **k: pytest.fail("float32 took the bf16 path"))
    adapter = HFModelAdapter(llama(), backend="native")
    adapter.reset([5, 17, 3])
    adapter.extend([-1], [-1])
    assert attention.REDUCED_PRECISION == (torch.bfloat16, torch.float16)


def test_bf16_head_step_takes_the_path_with_its_mask(monkeypatch):
    """An EAGLE-3 head's one-entry step in bf16 (a draft step) attends by the float32 products,
    with its tree mask, and agrees with the same step through torch's kernel (float64)."""
    from verispec.models import eagle_head

    from .test_eagle_head import tiny_head

    head = tiny_head()
    generator = torch.Generator().manual_seed(5)
    past = 9
    hidden, embeds = torch.randn(1, 1, 16, generator=generator, dtype=torch.float64), torch.randn(1, 1, 16, generator=generator, dtype=torch.float64)
    keys = torch.randn(1, 2, past, 4, generator=generator, dtype=torch.float64)
    values = torch.randn(1, 2, past, 4, generator=generator, dtype=torch.float64)
    allowed = torch.ones(1, 1, past + 1, dtype=torch.bool)
    allowed[0, 0, 3:6] = False  # entries of another branch of the tree
    exact = head.step(hidden, embeds, torch.tensor([[past]]), keys, values, allowed).out
    calls = []
    monkeypatch.setattr(eagle_head, "single_query_attention", lambda *a, **k: calls.append(1) or single_query_attention(*a, **k))
    head = head.to(torch.bfloat16)
    out = head.step(hidden.bfloat16(), embeds.bfloat16(), torch.tensor([[past]]), keys.bfloat16(), values.bfloat16(), allowed).out
    assert calls == [1]
    torch.testing.assert_close(out.double(), exact, atol=0.1, rtol=0.05)
    pair = head.step(hidden.bfloat16().expand(2, 1, 16), embeds.bfloat16().expand(2, 1, 16), torch.tensor([[past]] * 2),
                     keys.bfloat16().expand(2, -1, -1, -1), values.bfloat16().expand(2, -1, -1, -1), allowed.expand(2, -1, -1)).out
    assert calls == [1]  # two sequences keep torch's kernel
    torch.testing.assert_close(pair[0], out[0], atol=0.05, rtol=0)
    unmasked = head.step(hidden.bfloat16(), embeds.bfloat16(), torch.tensor([[past]]), keys.bfloat16(), values.bfloat16()).out
    assert not torch.allclose(unmasked, out)  # the mask was applied


def test_bf16_batch_of_one_step_takes_the_path_as_the_solo_runner(monkeypatch):
    """A batch of one sequence scoring one token (a server replica's plain step) attends by the
    float32 products, as the solo runner does, and gives the solo runner's logits."""
    from verispec.models import batch_runner
    from verispec.models.batch_runner import BatchedLlamaRunner
    from verispec.models.native_llama import NativeLlamaRunner

    calls = []
    monkeypatch.setattr(batch_runner, "single_query_attention", lambda *a, **k: calls.append(1) or single_query_attention(*a, **k))
    model = llama(hidden_size=96, intermediate_size=128, num_attention_heads=6, num_key_value_heads=2).to(torch.bfloat16)
    solo, slot = NativeLlamaRunner(model), BatchedLlamaRunner(NativeLlamaRunner(model)).open()
    prompt = [5, 17, 3, 9, 30, 2, 11]
    for runner in (solo, slot):
        runner.forward(prompt, list(range(len(prompt))), None, keep=1)
    batched, alone = slot.forward([4], [len(prompt)], None, keep=1), solo.forward([4], [len(prompt)], None, keep=1)
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(batched, alone, atol=0.05, rtol=0)

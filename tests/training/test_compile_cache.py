"""torch.compile as a setting: a compiled block predicts as the eager one, and a second
compile loads the compiled code from the cache folder instead of compiling again. (The
dense blocks compiled against eager in training, cold and warm: benchmarks/pipeline_training_bench.py.)"""

import copy

import torch

from gem.model.heads import MultiTaskHeads
from gem.training.compile_cache import ENV, compile_cache_counts, use_compile_cache


def test_compiled_block_predicts_as_eager_and_a_second_compile_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    torch._dynamo.reset()
    folder = use_compile_cache(tmp_path / "compile-cache")
    eager = MultiTaskHeads(48, [32], [16], num_surfaces=3, num_tasks=2, dropout=0.0).eval()
    top, surface, bias = torch.randn(64, 48), torch.randint(0, 3, (64,)), torch.zeros(64)
    expected = eager(top, surface, bias)[0].logits
    before = compile_cache_counts()
    compiled = torch.compile(copy.deepcopy(eager))
    torch.testing.assert_close(compiled(top, surface, bias)[0].logits, expected, rtol=1e-5, atol=1e-6)
    cold = compile_cache_counts()
    assert cold["fxgraph_miss"] > before["fxgraph_miss"] and any(folder.iterdir())
    torch._dynamo.reset()  # nothing compiled in memory, as in a new process
    again = torch.compile(copy.deepcopy(eager))
    torch.testing.assert_close(again(top, surface, bias)[0].logits, expected, rtol=1e-5, atol=1e-6)
    warm = compile_cache_counts()
    assert warm["fxgraph_hit"] > cold["fxgraph_hit"] and warm["fxgraph_miss"] == cold["fxgraph_miss"]

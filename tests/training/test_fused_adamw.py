"""FusedAdamW (gem/training/fused_adamw.py): torch's fused AdamW's update and state,
bit for bit, with the per-step bookkeeping done once."""

import copy
import functools

import torch
from torch import nn

from gem.training.fused_adamw import FusedAdamW
from gem.training.step import lr_factor


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 1))


def _pair(kind, model, steps: int = 20):
    opt = kind(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99), **(
        {"fused": True} if kind is torch.optim.AdamW else {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        lr_factor, warmup_steps=3, decay="cosine", total_steps=steps))
    return opt, sched


def _train(model, opt, sched, steps, start=0):
    for i in range(start, start + steps):
        x = torch.randn(32, 6, generator=torch.Generator().manual_seed(i))
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        sched.step()


def test_same_updates_and_state_as_torch():
    ours_model, torch_model = _model(), _model()
    ours, torch_opt = _pair(FusedAdamW, ours_model), _pair(torch.optim.AdamW, torch_model)
    _train(ours_model, *ours, 12)
    _train(torch_model, *torch_opt, 12)
    assert ours[0]._lists is not None  # the later steps took the cached path
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)
    got, want = ours[0].state_dict(), torch_opt[0].state_dict()
    assert got["param_groups"] == want["param_groups"]
    for i, state in want["state"].items():
        assert state.keys() == got["state"][i].keys()
        for key in state:
            assert torch.equal(got["state"][i][key], state[key]), key
    assert float(got["state"][0]["step"]) == 12.0


def test_resumed_from_its_state_dict_it_continues_the_same():
    model, twin = _model(), _model()
    opt, sched = _pair(FusedAdamW, model)
    _train(model, opt, sched, 5)
    twin.load_state_dict(model.state_dict())
    opt2, sched2 = _pair(FusedAdamW, twin)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a checkpoint
    sched2.load_state_dict(sched.state_dict())
    _train(model, opt, sched, 6, start=5)
    _train(twin, opt2, sched2, 6, start=5)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert float(opt2.state_dict()["state"][0]["step"]) == 11.0


def test_a_missing_gradient_or_a_closure_takes_torchs_step():
    model = _model()
    opt, _ = _pair(FusedAdamW, model)
    _train(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 3)
    assert opt._lists is not None
    first = next(model.parameters())
    frozen = first.detach().clone()
    opt.zero_grad(set_to_none=True)
    model[3](torch.randn(4, 16)).sum().backward()  # the first layer gets no gradient
    opt.step()
    assert opt._lists is None and torch.equal(first, frozen)
    loss = opt.step(lambda: model(torch.randn(4, 6)).sum())
    assert loss is not None

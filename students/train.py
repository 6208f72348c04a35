"""Train and evaluate one student on a StudentTable: a plain, seeded loop (the students
are small, their data sits in memory; no sharding, no fused optimizers).

Determinism: the model is built under ``torch.manual_seed(seed)`` by the caller, batches
are drawn from a generator seeded with ``seed``, and soft-target terms with weight 0 are
never computed, so KD with weight 0 reproduces the no-teacher student bit for bit.
"""

from __future__ import annotations

import math

import torch

from gem.training.metrics import SurfaceTaskMetrics
from gem.utils.progress import Progress
from students.config import OptimConfig
from students.data import StudentTable
from students.losses import SoftTarget, distill_loss
from students.model import VerticalStudent


@torch.no_grad()
def label_loss(model: VerticalStudent, table: StudentTable, batch_size: int = 8192) -> float:
    """Mean label-only loss (the joint click / click-and-conversion log loss) of the model
    on a table: the validation criterion, the same for every arm (no soft targets)."""
    from students.losses import _hard_rows

    model.eval()
    total = 0.0
    for lo in range(0, len(table), batch_size):
        sl = slice(lo, lo + batch_size)
        total += float(_hard_rows(model(table.inputs(sl)), table.labels[sl]).sum())
    return total / max(len(table), 1)


def train_student(model: VerticalStudent, table: StudentTable, optim: OptimConfig, *, seed: int,
                  soft_targets: list[SoftTarget] | None = None, desc: str = "student",
                  valid: StudentTable | None = None) -> list[float]:
    """Train in place; returns the mean loss of each epoch. With ``valid`` (rows after
    the training rows, never evaluation rows), the label loss on it is measured after
    every epoch (and every ``optim.check_rows`` training rows), the weights of the best
    check are kept, and with ``optim.patience`` > 0 training stops once that many epochs'
    rows have passed without improvement (``model.selection`` records the best check: its
    epoch, the epochs' rows it had trained, ``best_epochs``, and its validation loss).
    ``optim.stop_epochs`` > 0 stops after that many epochs' rows."""
    terms = [t for t in (soft_targets or []) if t.weight > 0]
    for t in terms:
        if t.probs.shape != table.labels.shape:
            raise ValueError(f"soft target {t.name}: shape {tuple(t.probs.shape)} != "
                             f"labels {tuple(table.labels.shape)}")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)  # decoupled decay
    gen = torch.Generator().manual_seed(seed)
    n = len(table)
    history = []
    model.train()
    epochs = math.ceil(optim.stop_epochs) if optim.stop_epochs > 0 else optim.epochs
    last_row = round(optim.stop_epochs * n) if optim.stop_epochs > 0 else epochs * n
    full, rest = divmod(last_row, max(n, 1))
    bar = Progress(full * -(-n // optim.batch_size) + -(-rest // optim.batch_size), desc, unit="batch")
    checking = valid is not None and len(valid) > 0
    best, best_state, best_epoch, best_rows = float("inf"), None, -1, 0
    seen, next_check, stop, checks = 0, optim.check_rows or n, False, 0

    def check(epoch: int) -> None:
        nonlocal best, best_state, best_epoch, best_rows, stop, checks
        checks += 1
        loss_v = label_loss(model, valid)
        model.train()
        if loss_v < best:
            best, best_epoch, best_rows = loss_v, epoch, seen
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        elif optim.patience and seen - best_rows >= optim.patience * n:
            stop = True

    for epoch in range(epochs):
        order = torch.randperm(n, generator=gen)
        total, count = 0.0, 0
        for lo in range(0, n, optim.batch_size):
            idx = order[lo:lo + optim.batch_size]
            out = model(table.inputs(idx))
            loss = distill_loss(out, table.labels[idx], [(t.weight, t.probs[idx], t.temperature) for t in terms])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
            seen += len(idx)
            bar.update()
            if seen >= last_row:
                break
            if checking and optim.check_rows and seen >= next_check and lo + optim.batch_size < n:
                next_check += optim.check_rows
                check(epoch)
                if stop:
                    break
        history.append(total / max(count, 1))
        if stop or seen >= last_row:
            if checking and not stop:
                check(epoch)
            break
        if checking:
            next_check = (epoch + 1) * n + (optim.check_rows or n)
            check(epoch)
            if stop:
                break
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.selection = {"best_epoch": best_epoch, "best_epochs": best_rows / max(n, 1), "valid_loss": best,
                       "epochs_run": len(history), "checks": checks}
    model.eval()
    return history


@torch.no_grad()
def predict(model: VerticalStudent, table: StudentTable, batch_size: int = 8192) -> torch.Tensor:
    """(N, T) joint probabilities."""
    model.eval()
    outs = [torch.sigmoid(model(table.inputs(slice(lo, lo + batch_size))).logits)
            for lo in range(0, len(table), batch_size)]
    return torch.cat(outs) if outs else torch.zeros(0, table.labels.shape[1])


def evaluate(probs: torch.Tensor, table: StudentTable, surfaces: list[str], tasks: list[str]) -> dict[str, float]:
    """``auc/<surface|all>/<task>``, ``ne/...``, ``calibration/...`` (gem.training.metrics)."""
    metrics = SurfaceTaskMetrics(surfaces, tasks)
    if len(table):
        metrics.update(probs, table.labels, table.surface)
    return metrics.compute()

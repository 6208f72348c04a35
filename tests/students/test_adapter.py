"""The Student Adapter recalibrates the teacher where fresh labels allow, and passes it
through where they do not (issue 43: fit on 3 rows per surface, its heads inverted the
teacher on a sparse real log, and the students distilled from them ranked below chance)."""

from __future__ import annotations

import torch
from sklearn.metrics import roc_auc_score

from students.adapter import StudentAdapter
from students.config import AdapterConfig
from students.data import StudentTable


def _table(n: int, seed: int, *, shift: float = 0.0, invert: bool = False) -> StudentTable:
    """One surface, one task: the teacher's logit is the truth's plus ``shift``
    (miscalibrated); ``invert`` draws labels that contradict it."""
    gen = torch.Generator().manual_seed(seed)
    truth = torch.randn(n, generator=gen) * 1.5
    p = torch.sigmoid(-truth if invert else truth)
    labels = (torch.rand(n, generator=gen) < p).float()[:, None]
    logits = (truth + shift)[:, None]
    zeros = torch.zeros(n, dtype=torch.long)
    return StudentTable(sparse=zeros[:, None], history=zeros[:, None], dense=torch.randn(n, 1, generator=gen),
                        surface=zeros, labels=labels, example_id=torch.arange(n), event_time_us=torch.arange(n),
                        user_raw=zeros, item_raw=zeros, teacher_logits=logits, teacher_all=logits[:, None, :],
                        surfaces=("feed",), tasks=("click",))


def _adapter(**cfg) -> StudentAdapter:
    return StudentAdapter(AdapterConfig(weight=0.5, **cfg), num_surfaces=1, num_tasks=1, dense_index=[0])


def test_a_head_with_too_few_labels_is_the_teacher_itself():
    few = _table(12, seed=1, invert=True)  # 12 rows, labels against the teacher
    assert min(few.labels.sum(), 12 - few.labels.sum()) < 10
    adapter = _adapter().fit(few)
    fresh = _table(2000, seed=2)
    assert torch.allclose(adapter(fresh)[:, 0], torch.sigmoid(fresh.teacher_logits[:, 0]), atol=1e-6)
    # with the floor off, the same 12 rows invert it: what the floor is for
    inverted = _adapter(min_labels=1).fit(few)(fresh)[:, 0]
    assert roc_auc_score(fresh.labels[:, 0], inverted) < 0.5 < roc_auc_score(fresh.labels[:, 0],
                                                                             fresh.teacher_logits[:, 0])


def test_a_head_with_enough_labels_recalibrates_a_shifted_teacher():
    fit, fresh = _table(3000, seed=3, shift=2.0), _table(3000, seed=4, shift=2.0)
    out = _adapter().fit(fit)(fresh)[:, 0]
    base = float(fresh.labels.mean())
    assert abs(float(torch.sigmoid(fresh.teacher_logits).mean()) - base) > 0.15  # the stale teacher is off
    assert abs(float(out.mean()) - base) < 0.03  # the adapter is not
    assert roc_auc_score(fresh.labels[:, 0], out) > roc_auc_score(fresh.labels[:, 0], fresh.teacher_logits[:, 0]) - 0.01

"""Which knowledge a student learned from, and the check that the knowledge it reads when
it scores is the same teacher's.

Recorded: ``attach_knowledge`` (students/data.py) notes the Feast store's lineage on the
table, ``build_student`` copies it onto the student, and students.store saves it in
student_config.json (``knowledge``):

    {"teacher_versions": ["models:/gem_teacher/1"], "teacher_digests": ["<sha256 of its weights>"],
     "vocab_digests": ["<12 hex>"], "digest": "<content of the store's knowledge tables>",
     "window": [start, end], "feast_repo": "<the store it read>"}

(``feast_repo`` as a run records paths, gem.utils.paths: a ``file://`` URI, or relative
to the workspace where the pipeline's distill stage trained it.)

The teacher version, weights digest and vocabulary digest come from the tags every
knowledge row carries (gem/knowledge/generate.py ``TAG_COLUMNS``).

The rule (``check_knowledge``), applied alike by the pyfunc model's predict
(students.pyfunc.score_window), the gate (gem_app/stages/gate.py, which scores through
score_window) and the online scorer (students.serving.Scorer, through ``check_serving``):

- A student that reads no teacher embeddings (``teacher_emb_dim`` 0: trained without
  representation transfer, KD and the adapter only teach it) reads no knowledge when it
  scores: the store is not checked (a ``feast_repo`` given to it is not read). Its
  vocabularies are checked as every model's are (gem.features.vocab.check_vocabularies).
- A student that reads them accepts a store whose embedding tables (the ones it reads)
  were all written by its own teacher: every teacher weights digest and teacher version
  in them among those it recorded, and every vocabulary digest equal to the student's own
  vocabularies (the teacher's: the student's windows are built with them). The content
  digest and window are recorded but not compared: the same teacher's knowledge
  re-registered for later days (the refresh, a daily knowledge job) is what the student
  is meant to read. Another teacher (another version, or the same version name from
  another store: ``models:/gem_teacher/1`` exists in every workspace, its weights differ)
  or another dataset (other vocabularies: the same ids are other users and items) is
  refused, naming both; so is a store holding a mix.
- A student saved before its knowledge was recorded, or a store whose tables predate the
  digest tags, cannot be checked: refused unless ``GEM_ALLOW_UNRECORDED_KNOWLEDGE=1``
  (then used with a warning), as gem.features.vocab does for unrecorded vocabularies.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gem.errors import UserError

log = logging.getLogger(__name__)

ALLOW_UNRECORDED = "GEM_ALLOW_UNRECORDED_KNOWLEDGE"
# the knowledge tables a student reads when it scores (the predictions are training targets only)
READ_TABLES = ("user_embedding.parquet", "item_embedding.parquet")


class KnowledgeMismatch(UserError, ValueError):
    """A student paired with a Feast store whose knowledge is another teacher's or another dataset's."""


_RECORDS: dict[tuple, dict] = {}  # per store and its knowledge files' sizes and times: hashed once


def knowledge_record(repo_dir: str | Path) -> dict:
    """What a student trained on ``repo_dir``'s knowledge records (see the module docstring)."""
    from gem.knowledge.feast import SOURCE_FILES, registered_knowledge
    from gem.utils.paths import shown

    files = [Path(repo_dir) / "data" / name for name in sorted(SOURCE_FILES.values())]
    key = (str(Path(repo_dir).resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files
                                            if f.is_file()))
    if key not in _RECORDS:
        found = registered_knowledge(repo_dir)
        _RECORDS[key] = {**{k: list(found[k]) for k in ("teacher_versions", "teacher_digests", "vocab_digests",
                                                          "window")},
                         "digest": found["digest"], "feast_repo": shown(key[0])}
    return dict(_RECORDS[key])


def _short(values: list[str], n: int = 12) -> str:
    return ", ".join(v[:n] for v in values) or "none"


def _describe(versions: list[str], digests: list[str], vocab: list[str]) -> str:
    return f"teacher {', '.join(versions) or '(no version)'} (weights {_short(digests)}), vocabularies {_short(vocab)}"


def knowledge_problem(model, repo_dir: str | Path, *, name: str = "the student") -> str:
    """'' when ``model`` may read ``repo_dir``'s knowledge (or reads none), else why not
    (one sentence naming both sides). Unrecorded lineage reads as a problem unless
    ``GEM_ALLOW_UNRECORDED_KNOWLEDGE=1``."""
    from gem.features.vocab import vocabulary_digest
    from gem.knowledge.feast import knowledge_tags
    from gem.knowledge.generate import ITEM_EMBEDDING, USER_EMBEDDING

    if not int(getattr(model, "teacher_emb_dim", 0) or 0):
        return ""
    store = knowledge_tags(repo_dir, (USER_EMBEDDING, ITEM_EMBEDDING))
    if not store["tables"]:
        return (f"{name} reads the teacher's embeddings but the Feast store {repo_dir} holds none "
                "(no teacher_*_embedding source): register its teacher's knowledge there")
    recorded = dict(getattr(model, "knowledge", None) or {})
    # the student's own vocabularies are the teacher's (its windows are built with them)
    expected_vocab = [vocabulary_digest(model.vocab_digests)] if model.vocab_digests else \
        list(recorded.get("vocab_digests", []))
    unrecorded = []
    if not recorded.get("teacher_digests") or not expected_vocab:
        unrecorded.append(f"{name} was saved without the lineage of the knowledge it learned from")
    if store["unrecorded"] or not store["teacher_digests"] or not store["vocab_digests"]:
        unrecorded.append(f"the Feast store {repo_dir} holds knowledge without teacher and vocabulary digests "
                          "(written before they were tagged)")
    if unrecorded:
        text = "; ".join(unrecorded) + ", so nothing shows it is the same teacher's"
        if os.environ.get(ALLOW_UNRECORDED) == "1":
            log.warning("%s; used anyway (%s=1)", text, ALLOW_UNRECORDED)
            return ""
        return (f"{text}; regenerate them (retrain the student, or generate and register the knowledge again), "
                f"or set {ALLOW_UNRECORDED}=1 to use it unchecked")
    other_vocab = [v for v in store["vocab_digests"] if v not in expected_vocab]
    other_teacher = [d for d in store["teacher_digests"] if d not in recorded["teacher_digests"]] + \
        [v for v in store["teacher_versions"] if v not in recorded.get("teacher_versions", [])]
    if not other_vocab and not other_teacher:
        return ""
    mine = _describe(recorded.get("teacher_versions", []), recorded["teacher_digests"], expected_vocab)
    theirs = _describe(store["teacher_versions"], store["teacher_digests"], store["vocab_digests"])
    what = "another dataset's (other vocabularies: the same ids are other users and items)" if other_vocab \
        else "another teacher's"
    trained = recorded.get("feast_repo")
    return (f"{name} learned from {mine}; the Feast store {repo_dir} holds {theirs}: {what} knowledge, which it "
            "must not read. Give it a store holding its own teacher's knowledge"
            + (f" (it was trained with {trained})" if trained else "") + ", or a student of that store's teacher")


def check_knowledge(model, repo_dir: str | Path, *, name: str = "the student") -> None:
    """Refuse (KnowledgeMismatch) a store whose knowledge ``model`` must not read."""
    problem = knowledge_problem(model, repo_dir, name=name)
    if problem:
        raise KnowledgeMismatch(problem)


def check_serving(model, repo_dir: str | Path, vocab_dir: str | Path, *, name: str = "the student") -> None:
    """What the online scorer checks before it opens the store: the knowledge it will read
    (``check_knowledge``) and, for a student that records its vocabularies, that
    ``vocab_dir`` (the window whose vocabularies map raw ids) was built with them (a
    model without them is refused before it gets here by the serving entry points,
    students/http_serving.py)."""
    if model.vocab_digests:
        from gem.features.loader import load_feature_spec
        from gem.features.vocab import check_vocabularies

        check_vocabularies(model.vocab_digests, load_feature_spec(vocab_dir).vocab_digests, model=name,
                           window=str(vocab_dir))
    check_knowledge(model, repo_dir, name=name)

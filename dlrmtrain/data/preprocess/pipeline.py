"""Streaming preprocessing of raw Criteo day files into the project's binary layout.

One part per input file (`day_3.gz` -> part `day_3`), files processed in parallel
by a process pool. Plain hashing is one pass. The MLPerf vocabulary is two passes
but parses the text only once: pass 1 parses, stages each file's rows with hashed
categoricals and records its distinct values; pass 2 remaps the staged ids (a
memory-bound array pass) once the vocabulary over all files is known. Staging
needs disk space equal to the output. Every step is resumable: finished per-file
results are skipped, unfinished ones redone (see formats/binary.py).
"""

from __future__ import annotations

import multiprocessing as mp
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from dlrmtrain.data.formats import binary as bf
from dlrmtrain.data.formats.criteo_text import BadLineStats, iter_parsed
from dlrmtrain.features import log_transform_dense
from dlrmtrain.data.preprocess.space import estimate_space, refuse_if_short
from dlrmtrain.data.preprocess.vocab import (
    MLPERF_HASH_RANGE, DistinctCounter, MlperfVocabulary, PlainHash, load_distinct, save_distinct,
)
from dlrmtrain.run.leftovers import remove_dead_tmp_dirs
from dlrmtrain.run.lock import PREPROCESS_LOCK_FILE, RunLock

VOCAB_FILE = "vocabulary.npz"
PASS1_DIR = "pass1"
STAGING_DIR = "staging"  # pass-1 parts with hashed (not yet remapped) categoricals
REMAP_ROWS = 1 << 16  # small blocks keep the remap's temporaries in cache


def part_name(path: str | Path) -> str:
    """`day_3.gz` -> `day_3`, `train.txt` -> `train`."""
    name = Path(path).name
    return re.sub(r"(\.(txt|tsv|csv))?(\.gz)?$", "", name)


@dataclass
class FileResult:
    name: str
    rows: int
    bytes_in: int
    skipped: bool
    bad_lines: BadLineStats


@dataclass
class PreprocessSummary:
    """What a run did, for the closing summary and for tests."""

    out_dir: Path
    mode: str
    table_sizes: list[int]
    files: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def bad_lines(self) -> BadLineStats:
        stats = BadLineStats()
        for f in self.files:
            stats.merge(f.bad_lines)
        return stats

    def render(self) -> str:
        done = [f for f in self.files if not f.skipped]
        mb = sum(f.bytes_in for f in done) / 1e6
        lines = [
            f"preprocessed into {self.out_dir} (categorical mode: {self.mode})",
            f"  files: {len(done)} converted, {len(self.files) - len(done)} already finished (skipped)",
            f"  rows:  {sum(f.rows for f in self.files):,} total; {sum(f.rows for f in done):,} converted now",
            f"  input: {mb:,.1f} MB on disk in {self.seconds:.1f} s "
            f"({mb / max(self.seconds, 1e-9):,.1f} MB/s over all workers)",
            "  steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.step_seconds.items()),
            f"  table sizes: {self.table_sizes}",
        ]
        bad = self.bad_lines
        if bad.crlf_lines:
            lines.append(f"  CR LF line endings: {bad.crlf_lines:,} lines (accepted, CR stripped)")
        lines.append(f"  bad lines skipped: {bad.count}")
        lines += [f"    e.g. {example}" for example in bad.examples]
        return "\n".join(lines)


# ---- per-file work (runs in worker processes) ----------------------------------------

# Set in each worker by the pool initializer. With the fork context the mapper (up to
# ~200 MB of vocabulary) is inherited by the workers instead of pickled per job.
_progress_counter: Any = None  # shared byte counter for the progress bar
_worker_mapper: PlainHash | MlperfVocabulary | None = None


def _init_worker(counter: Any, mapper: PlainHash | MlperfVocabulary | None = None) -> None:
    global _progress_counter, _worker_mapper
    _progress_counter, _worker_mapper = counter, mapper


def _report_bytes(n: int) -> None:
    if _progress_counter is not None:
        with _progress_counter.get_lock():
            _progress_counter.value += n


def _stage_file(path: str, out_dir: str, hash_range: int, bad_lines: str,
                expected_rows: int | None = None) -> FileResult:
    """Vocabulary pass 1 for one file: the only parse of its text.

    Writes a staging part (dense transformed, labels, categoricals already hashed modulo
    `hash_range`) and the file's distinct hashed values per column, each write-then-rename.
    """
    stats, counter = BadLineStats(), DistinctCounter(hash_range)
    out, name = Path(out_dir), part_name(path)
    writer = bf.PartWriter(out / STAGING_DIR, name, expected_rows)
    try:
        for chunk in iter_parsed(path, bad_lines, stats, on_bytes=_report_bytes):
            hashed = (chunk.cats % np.uint32(hash_range)).astype(np.int32)
            counter.add(hashed)
            writer.append(log_transform_dense(chunk.dense), hashed, chunk.labels)
        writer.commit({"source": bf.source_fingerprint(path), **_stats_meta(stats)})
    except BaseException:
        writer.abort()
        raise
    save_distinct(out / PASS1_DIR / f"{name}.npz", counter.distinct_values(), hash_range)
    return FileResult(name, writer.rows, Path(path).stat().st_size, False, stats)


def _remap_staged_part(path: str, out_dir: str, bad_lines: str,
                       expected_rows: int | None = None) -> FileResult:
    """Vocabulary pass 2 for one file: hashed ids -> vocabulary ids; no text is parsed again.

    Dense and labels are taken over from the staging part unchanged (hard links), the staging
    part is removed only after the final part is committed. (`expected_rows` is taken for the
    jobs' common signature: the staged part knows its rows.)
    """
    vocab = _worker_mapper
    assert vocab is not None, "worker started without a vocabulary"
    out, name = Path(out_dir), part_name(path)
    staging_root = out / STAGING_DIR
    meta = bf.finished_part_meta(staging_root, name)
    assert meta is not None, f"{name}: staging part missing"
    staged = bf.BinaryPart(staging_root, name, meta["rows"])
    writer = bf.PartWriter(out, name, meta["rows"])
    try:
        for lo in range(0, meta["rows"], REMAP_ROWS):
            hi = min(lo + REMAP_ROWS, meta["rows"])
            writer.append_file("sparse.i32", vocab.map(np.asarray(staged.read(lo, hi).sparse)))
            _report_bytes(int(meta["source"]["bytes"] * (hi - lo) / meta["rows"]))
        for fname in ("dense.f32", "labels.u8"):
            writer.adopt(fname, staging_root / "parts" / name / fname, meta["sha256"][fname])
        stats = _stats_from_meta(meta)  # pass 1 saw the lines; its examples are kept
        writer.commit({"source": meta["source"], **_stats_meta(stats)}, rows=meta["rows"])
    except BaseException:
        writer.abort()
        raise
    del staged
    shutil.rmtree(staging_root / "parts" / name)
    return FileResult(name, meta["rows"], meta["source"]["bytes"], False, stats)


def _stats_meta(stats: BadLineStats) -> dict[str, Any]:
    """What a part's part.json keeps of its input's line statistics."""
    return {"bad_lines_skipped": stats.count, "bad_line_examples": [str(b) for b in stats.examples],
            "crlf_lines": stats.crlf_lines}


def _stats_from_meta(meta: dict[str, Any]) -> BadLineStats:
    stats = BadLineStats(count=meta.get("bad_lines_skipped", 0),
                         crlf_lines=meta.get("crlf_lines", 0))
    stats.examples = list(meta.get("bad_line_examples", []))  # as text: enough to show them
    return stats


def _convert_text_file(path: str, out_dir: str, bad_lines: str,
                       expected_rows: int | None = None) -> FileResult:
    """Hash mode, the single pass for one file: parse, hash ids, transform dense, write the part."""
    mapper = _worker_mapper
    assert mapper is not None, "worker started without a categorical mapper"
    stats = BadLineStats()
    writer = bf.PartWriter(out_dir, part_name(path), expected_rows)
    try:
        for chunk in iter_parsed(path, bad_lines, stats, on_bytes=_report_bytes):
            writer.append(log_transform_dense(chunk.dense), mapper.map(chunk.cats), chunk.labels)
        writer.commit({"source": bf.source_fingerprint(path), **_stats_meta(stats)})
    except BaseException:
        writer.abort()
        raise
    return FileResult(writer.name, writer.rows, Path(path).stat().st_size, False, stats)


# ---- orchestration ----------------------------------------------------------------

def _run_pool(
    jobs: list[tuple[Callable[..., FileResult], tuple]], workers: int, desc: str, total_bytes: int, progress: bool,
    mapper: PlainHash | MlperfVocabulary | None = None,
) -> list[FileResult]:
    """Run file jobs on `workers` processes with one byte-level progress bar."""
    if not jobs:
        return []
    ctx = mp.get_context("fork")
    counter = ctx.Value("q", 0)
    bar = tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, disable=not progress)
    results: list[FileResult] = []
    try:  # the bar ends its line even when a job fails: the error goes on a line of its own
        if workers <= 1:
            _init_worker(counter, mapper)
            try:
                for fn, args in jobs:
                    results.append(fn(*args))
                    bar.update(counter.value - bar.n)
            finally:
                _init_worker(None)
        else:
            with ctx.Pool(min(workers, len(jobs)), initializer=_init_worker, initargs=(counter, mapper)) as pool:
                pending = [pool.apply_async(fn, args) for fn, args in jobs]
                while not all(p.ready() for p in pending):
                    time.sleep(0.2)
                    bar.update(counter.value - bar.n)
                results = [p.get() for p in pending]  # re-raises a worker's BadLineError here
        bar.update(counter.value - bar.n)
    finally:
        bar.close()
    return results


def _check_unique_names(inputs: Sequence[str]) -> None:
    names = [part_name(p) for p in inputs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"input files map to the same part name(s) {duplicates}: rename them")


def _same_source(recorded: dict[str, Any], path: str) -> bool:
    now = bf.source_fingerprint(path)
    return recorded["bytes"] == now["bytes"] and recorded["mtime_ns"] == now["mtime_ns"]


def _skip_result(out_dir: Path, path: str) -> FileResult | None:
    """A FileResult for an input whose part is already finished from the same source."""
    meta = bf.finished_part_meta(out_dir, part_name(path))
    if meta is None:
        return None
    now = bf.source_fingerprint(path)
    if not _same_source(meta["source"], path):
        raise ValueError(f"{out_dir}/parts/{meta['name']} was made from a different {path} "
                         "(size or mtime changed): delete the part to redo it")
    return FileResult(meta["name"], meta["rows"], now["bytes"], True, _stats_from_meta(meta))


def _forget_stale_stage(out_dir: Path, path: str) -> None:
    """`path` changed after pass 1 staged it: drop its stage, its distinct values and the
    vocabulary built from them, so pass 1 redoes it. Refused once pass 2 has written a
    part with that vocabulary (the other parts would have to be redone too)."""
    name = part_name(path)
    written = sorted(p.name for p in (out_dir / "parts").glob("*")
                     if bf.finished_part_meta(out_dir, p.name) is not None)
    if written:
        raise ValueError(f"{path} changed after pass 1 staged it, and pass 2 has already "
                         f"written {written} with the vocabulary of its old content: "
                         f"delete {out_dir} and rerun")
    shutil.rmtree(out_dir / STAGING_DIR / "parts" / name)
    (out_dir / PASS1_DIR / f"{name}.npz").unlink(missing_ok=True)
    (out_dir / VOCAB_FILE).unlink(missing_ok=True)


def _build_vocabulary(
    inputs: Sequence[str], out_dir: Path, hash_range: int, bad_lines: str, workers: int, progress: bool,
    expected_rows: dict[str, int] | None = None,
) -> MlperfVocabulary:
    """Pass 1 where still needed, then the vocabulary over every input (saved, reused on resume)."""
    if not 0 < hash_range <= 2**31:
        raise ValueError(f"hash_range must be in (0, 2^31], got {hash_range}")
    (out_dir / PASS1_DIR).mkdir(parents=True, exist_ok=True)

    def needs_stage(p: str) -> bool:
        name = part_name(p)
        if not (out_dir / PASS1_DIR / f"{name}.npz").exists():
            return True
        final_done = bf.finished_part_meta(out_dir, name) is not None
        staged = bf.finished_part_meta(out_dir / STAGING_DIR, name)
        if staged is not None and not _same_source(staged["source"], p):
            _forget_stale_stage(out_dir, p)
            return True
        return not final_done and staged is None

    todo = [p for p in inputs if needs_stage(p)]
    _run_pool(
        [(_stage_file, (p, str(out_dir), hash_range, bad_lines, (expected_rows or {}).get(p))) for p in todo],
        workers, "pass 1/2 (parse, count distinct)", sum(Path(p).stat().st_size for p in todo), progress,
    )
    vocab_path = out_dir / VOCAB_FILE
    if vocab_path.exists():
        return MlperfVocabulary.load(vocab_path)
    per_file = []
    for p in inputs:
        columns, file_range = load_distinct(out_dir / PASS1_DIR / f"{part_name(p)}.npz")
        if file_range != hash_range:
            raise ValueError(f"{out_dir}/{PASS1_DIR}/{part_name(p)}.npz used hash range {file_range}, not {hash_range}")
        per_file.append(columns)
    vocab = MlperfVocabulary.from_distinct(per_file, hash_range)
    vocab.save(vocab_path)
    return vocab


def preprocess(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    mode: str = "mlperf_vocab",
    table_sizes: Sequence[int] | None = None,
    hash_range: int = MLPERF_HASH_RANGE,
    bad_lines: str = "error",
    workers: int = 1,
    progress: bool = True,
) -> PreprocessSummary:
    """Convert raw day files (plain or .gz) into `out_dir`; returns the run's summary.

    mode "mlperf_vocab": hash modulo `hash_range`, then contiguous ids per column over
    all `inputs` (two passes). mode "hash": `value % table_sizes[c]` (one pass).
    """
    inputs = [str(p) for p in inputs]
    _check_unique_names(inputs)
    out = Path(out_dir)
    space = estimate_space({p: part_name(p) for p in inputs}, out, mode, hash_range, workers,
                           out / STAGING_DIR, out / PASS1_DIR, out / VOCAB_FILE)
    refuse_if_short(out, space)  # before anything is written, the folder included
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out, PREPROCESS_LOCK_FILE, user="another preprocess",
                   advice="choose another --out")
    lock.acquire()  # one writer per dataset: a second one would orphan the first's parts
    try:
        return _preprocess_locked(inputs, out, mode, table_sizes, hash_range, bad_lines,
                                  workers, progress, space.rows)
    except BaseException:
        _remove_dead_writers(out)  # a failed pool's other workers were killed mid-part
        raise
    finally:
        lock.release()


def _remove_dead_writers(out: Path) -> None:
    """The temporary part folders of writers that are gone (killed workers, an earlier run)."""
    for parts in (out / "parts", out / STAGING_DIR / "parts"):
        remove_dead_tmp_dirs(parts)


def _preprocess_locked(inputs: list[str], out: Path, mode: str, table_sizes, hash_range: int,
                       bad_lines: str, workers: int, progress: bool,
                       expected_rows: dict[str, int]) -> PreprocessSummary:
    start = time.perf_counter()
    _remove_dead_writers(out)  # left by killed workers
    existing = out / bf.MANIFEST_NAME
    if existing.exists():
        old = bf.read_manifest(out)
        if old["categorical_mode"] != mode:
            raise ValueError(f"{out} holds a {old['categorical_mode']} dataset; cannot resume as {mode}")
    mapper: PlainHash | MlperfVocabulary
    steps: dict[str, float] = {}
    if mode == "hash":
        if table_sizes is None:
            raise ValueError("mode 'hash' needs table_sizes")
        mapper = PlainHash(list(table_sizes))
    elif mode == "mlperf_vocab":
        mapper = _build_vocabulary(inputs, out, hash_range, bad_lines, workers, progress, expected_rows)
        steps["pass 1 + vocabulary"] = time.perf_counter() - start
    else:
        raise ValueError(f"unknown categorical mode {mode!r}; expected 'mlperf_vocab' or 'hash'")

    skipped = {p: _skip_result(out, p) for p in inputs}
    todo = [p for p in inputs if skipped[p] is None]
    convert = _convert_text_file if mode == "hash" else _remap_staged_part
    converted = _run_pool(
        [(convert, (p, str(out), bad_lines, expected_rows.get(p))) for p in todo],
        workers, "convert" if mode == "hash" else "pass 2/2 (remap ids)",
        sum(Path(p).stat().st_size for p in todo), progress, mapper,
    )
    steps["convert" if mode == "hash" else "pass 2"] = time.perf_counter() - start - sum(steps.values())
    staging_parts = out / STAGING_DIR / "parts"
    if staging_parts.exists() and not any(staging_parts.iterdir()):
        shutil.rmtree(out / STAGING_DIR)  # every staged part has been remapped
    by_name = {r.name: r for r in converted}
    results = [skipped[p] or by_name[part_name(p)] for p in inputs]
    if not sum(r.rows for r in results):
        raise ValueError(f"no rows in {', '.join(inputs)}: every line was skipped as bad")
    parts_meta = [bf.finished_part_meta(out, r.name) for r in results]
    bf.write_manifest(out, {
        "categorical_mode": mode,
        "hash_range": hash_range if mode == "mlperf_vocab" else None,
        "table_sizes": mapper.table_sizes,
        "dense_transform": "log1p(max(x, 0)), missing = 0",
        "missing_categorical": "hashed as value 0",
        "rows": sum(r.rows for r in results),
        "parts": parts_meta,
    })
    return PreprocessSummary(out, mode, mapper.table_sizes, results, time.perf_counter() - start, steps)

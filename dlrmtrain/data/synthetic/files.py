"""Write synthetic data to disk in the project's binary layout (data_prep/make_synthetic.py).

Each part is one `generate` call with its own seed, so parts can be made (and
remade) independently; the teacher is fixed by `synthetic.teacher_seed`, so all
parts label the same task.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from dlrmtrain.config.schema import DataConfig
from dlrmtrain.data.formats import binary as bf
from dlrmtrain.data.synthetic.generator import generate, tables_and_exponents


def write_synthetic_dataset(
    data: DataConfig, out_dir: str | Path, rows_per_part: int, num_parts: int, seed: int = 0,
    progress: bool = True,
) -> dict:
    """Generate `num_parts` parts (day_0, day_1, ...) into `out_dir`; returns the manifest."""
    out = Path(out_dir)
    sizes, _ = tables_and_exponents(data)
    if max(sizes) >= 2**31:
        raise ValueError("table sizes must fit int32 ids in the binary layout")
    metas = []
    for i in tqdm(range(num_parts), desc="synthetic parts", disable=not progress):
        name = f"day_{i}"
        done = bf.finished_part_meta(out, name)
        if done is not None and done.get("seed") == seed + i and done["rows"] == rows_per_part:
            metas.append(done)  # resumable like preprocessing
            continue
        arrays = generate(data, rows_per_part, seed=seed + i)
        writer = bf.PartWriter(out, name)
        writer.append(arrays.dense, arrays.sparse.astype("int32"), arrays.labels.astype("uint8"))
        metas.append(writer.commit({"source": None, "seed": seed + i}))
    manifest = {
        "categorical_mode": "synthetic",
        "synthetic_profile": data.synthetic.profile,
        "table_sizes": sizes,
        "dense_transform": "log1p of lognormal counts (generated)",
        "rows": sum(m["rows"] for m in metas),
        "parts": metas,
    }
    bf.write_manifest(out, manifest)
    return manifest

"""In-batch unique rates of the synthetic source, and the calibration that matches them to Yambda's.

The reference (mlcommons/training recommendation_v4, PR #889) reports, in
`dlrm_v4/train/gin/yambda_5b.gin` (the `ec_index_dedup` notes, measured with
DIAG_UNIQUE_EMB on the yambda-5b config: per-rank batch 1024, user-major streaming
order, ~2.69 M UIH ids per batch, i.e. ~2627 history events per sample), that
uih.item_id is ~2.4 % unique within a batch, uih.album_id ~1.5 % and uih.artist_id
~0.6 %. A rate here is the same quantity: distinct ids / history positions of one
rank's batch, per feature.

`python -m dlrmtrain.data.yambda.calibration [--calibrate]` prints them. `calibrate` tunes
three knobs of a profile by fixed-point iteration on measured batches:
favourite artists per user (the artist rate), the album skew (albums per artist, hence
the album rate) and the track skew (tracks per album, hence the item rate).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from dlrmtrain.data.yambda.synthetic import CrossSpec, YambdaLikeGenerator, YambdaLikeProfile

REFERENCE_UNIQUE_RATES = {"item_id": 0.024, "album_id": 0.015, "artist_id": 0.006}
"""The reference's reported in-batch unique rates of the UIH sequence features."""
REFERENCE_BATCH_SIZE = 1024
"""Per-rank batch of that measurement (yambda_5b.gin BATCH_SIZE default)."""
REFERENCE_HISTORY_EVENTS = 2627
"""History events per sample of that measurement (2.69 M ids / 1024 samples)."""


def unique_rates(generator: YambdaLikeGenerator, batch_size: int, num_batches: int = 2,
                 first_batch: int = 0) -> dict[str, float]:
    """Mean over `num_batches` consecutive train batches of distinct ids / history positions."""
    sums = dict.fromkeys(REFERENCE_UNIQUE_RATES, 0.0)
    for b in range(first_batch, first_batch + num_batches):
        cols = generator.columns(np.arange(b * batch_size, (b + 1) * batch_size))
        n = max(1, len(cols.history["item_id"]))
        for k in sums:
            sums[k] += len(np.unique(cols.history[k])) / n
    return {k: v / num_batches for k, v in sums.items()}


@dataclass
class Calibration:
    profile: YambdaLikeProfile
    rates: dict[str, float]
    iterations: int


def calibrate(profile: YambdaLikeProfile, crosses: Sequence[CrossSpec], batch_size: int,
              targets: dict[str, float] = REFERENCE_UNIQUE_RATES, tolerance: float = 0.04,
              max_iterations: int = 30, num_batches: int = 2) -> Calibration:
    """The profile whose rates at `batch_size` are within `tolerance` (relative) of `targets`.

    Raises ValueError when the catalog shape cannot reach them (e.g. too few albums per artist).
    """
    rates: dict[str, float] = {}
    for it in range(1, max_iterations + 1):
        rates = unique_rates(YambdaLikeGenerator(profile, crosses), batch_size, num_batches)
        err = {k: rates[k] / targets[k] - 1 for k in targets}
        if max(abs(e) for e in err.values()) <= tolerance:
            return Calibration(profile, rates, it)
        # Artist uniques grow with the favourites; the album / item uniques per artist / album
        # fall as their skews rise. Each knob answers its own ratio.
        album_per_artist = (rates["album_id"] / rates["artist_id"]) / (targets["album_id"] / targets["artist_id"])
        item_per_album = (rates["item_id"] / rates["album_id"]) / (targets["item_id"] / targets["album_id"])
        profile = replace(
            profile,
            artists_per_user=float(np.clip(profile.artists_per_user * targets["artist_id"] / rates["artist_id"],
                                           1.0, 1e5)),
            album_zipf=float(np.clip(profile.album_zipf + 2.0 * np.log(album_per_artist), 0.0, 8.0)),
            track_zipf=float(np.clip(profile.track_zipf + 2.0 * np.log(item_per_album), 0.0, 8.0)))
    raise ValueError(f"calibration did not reach {targets} within {tolerance:.0%} after {max_iterations} "
                     f"iterations (last rates {rates}, profile {profile}); a catalog with more albums per "
                     "artist or tracks per album gives the skews room")


def main(argv: list[str] | None = None) -> None:
    """Print the default profile's rates at the reference's batch (or re-fit them: --calibrate)."""
    import argparse
    from dataclasses import asdict

    from dlrmtrain.sequence_features import CROSS_SPECS
    p = argparse.ArgumentParser(description="In-batch unique rates of the synthetic Yambda-like source.")
    p.add_argument("--batch-size", type=int, default=REFERENCE_BATCH_SIZE, help="per-rank batch")
    p.add_argument("--history-length", type=int, default=REFERENCE_HISTORY_EVENTS)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--calibrate", action="store_true", help="re-fit the profile first and print it")
    a = p.parse_args(argv)
    profile = replace(YambdaLikeProfile(), history_length=a.history_length)
    if a.calibrate:
        fit = calibrate(profile, CROSS_SPECS, a.batch_size, tolerance=0.02)
        profile = fit.profile
        knobs = {k: v for k, v in asdict(profile).items() if k in ("artists_per_user", "album_zipf", "track_zipf")}
        print(f"calibrated in {fit.iterations} iterations: {knobs}")
    rates = unique_rates(YambdaLikeGenerator(profile, CROSS_SPECS), a.batch_size, a.batches)
    for key, target in REFERENCE_UNIQUE_RATES.items():
        print(f"{key:10s} {rates[key]:.4%} unique (reference {target:.1%})")


if __name__ == "__main__":
    main()

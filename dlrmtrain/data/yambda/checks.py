"""The rules of `data.yambda` (sources `yambda` and `synthetic_yambda`): errors name the key."""

from __future__ import annotations

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import DataConfig
from dlrmtrain.data.yambda.history import uih_budget
from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES, CROSS_NAMES


def check_yambda_data(data: DataConfig, global_batch_size: int, world_size: int = 1) -> None:
    """Raise ConfigError for an impossible data.yambda setting of the configured source."""
    y, syn = data.yambda, data.yambda.synthetic
    if data.source == "yambda" and not y.path:
        raise ConfigError("data.yambda.path: source 'yambda' needs the prepared dataset directory")
    for key in ("history_length", "scan_window", "max_seq_len", "window_seconds", "num_train_windows",
                "eval_num_windows"):
        if getattr(y, key) < 1:
            raise ConfigError(f"data.yambda.{key}: must be at least 1, got {getattr(y, key)}")
    if uih_budget(y.max_seq_len, 1, len(CONTEXTUAL_FEATURES)) < 1:
        raise ConfigError(f"data.yambda.max_seq_len: {y.max_seq_len} leaves no room for history "
                          "beside the candidate and the 8 contextual features")
    for key in ("shuffle_fraction", "train_fraction"):
        if not 0.0 <= getattr(y, key) <= 1.0:
            raise ConfigError(f"data.yambda.{key}: must be in [0, 1], got {getattr(y, key)}")
    for name, rows in y.cross_rows.items():
        if name not in CROSS_NAMES:
            raise ConfigError(f"data.yambda.cross_rows.{name}: not a cross; the crosses are {CROSS_NAMES}")
        if rows < 1:
            raise ConfigError(f"data.yambda.cross_rows.{name}: a table needs at least one row, got {rows}")
    if global_batch_size % world_size:
        raise ConfigError(f"run.global_batch_size: {global_batch_size} does not divide by {world_size} ranks")
    if data.source != "synthetic_yambda":
        return
    for key in ("num_users", "anchors_per_user", "history_length", "num_artists", "albums_per_artist",
                "tracks_per_album"):
        if getattr(syn, key) < 1:
            raise ConfigError(f"data.yambda.synthetic.{key}: must be at least 1, got {getattr(syn, key)}")
    if not 0.0 < syn.min_history_fraction <= 1.0:
        raise ConfigError(f"data.yambda.synthetic.min_history_fraction: must be in (0, 1], "
                          f"got {syn.min_history_fraction}")
    room = uih_budget(y.max_seq_len, 1, len(CONTEXTUAL_FEATURES))
    if syn.history_length > room:
        raise ConfigError(f"data.yambda.synthetic.history_length: {syn.history_length} events do not fit "
                          f"data.yambda.max_seq_len {y.max_seq_len} (at most {room} beside the candidate "
                          "and the 8 contextual features)")
    if syn.num_users * syn.anchors_per_user < global_batch_size:
        raise ConfigError(f"data.yambda.synthetic: {syn.num_users} users x {syn.anchors_per_user} anchors "
                          f"is less than one global batch ({global_batch_size})")

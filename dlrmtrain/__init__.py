"""dlrmtrain: DLRM training with lossless embedding all-to-all compression."""

from dlrmtrain.known_warnings import filter_known_warnings

filter_known_warnings()

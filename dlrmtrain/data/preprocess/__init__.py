"""Offline preprocessing (data_prep/): raw days -> binary layout (pipeline.py), the
categorical id mapping (vocab.py), MLPerf DCNv2 multi-hot bags (multi_hot.py), the disk
space a run needs, checked before it writes (space.py)."""

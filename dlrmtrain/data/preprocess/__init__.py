"""Offline preprocessing (data_prep/): raw days -> binary layout (pipeline.py), the
categorical id mapping (vocab.py), MLPerf DCNv2 multi-hot bags (multi_hot.py)."""

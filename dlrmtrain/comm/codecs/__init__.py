"""The single-module codecs: `none` and the LOSSY qcomms (`lossy.py`).

`dedup` and `auto` have grown several modules each: comm/dedup/, comm/auto/.
"""

import os

# Two cores: keep intra-op threads from fighting between ranks and tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    from dlrmtrain.known_warnings import pytest_filter_lines

    for line in pytest_filter_lines():
        config.addinivalue_line("filterwarnings", line)

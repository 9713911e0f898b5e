import os

# Two cores: keep intra-op threads from fighting between ranks and tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")

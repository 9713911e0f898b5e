"""Name → codec registry (only TorchRec's stock path, `none`, until codecs land)."""


def available_codecs() -> list[str]:
    return ["none"]

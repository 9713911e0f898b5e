"""On-disk formats of Criteo data and their parsing: raw text days, the project's
binary layout, and the layouts other pipelines write (TorchRec .npy/.npz, facebook .bin)."""

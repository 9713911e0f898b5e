"""On-disk formats of Criteo data and their parsing: raw text days, the project's
binary layout, and the layouts other pipelines write (TorchRec .npy/.npz, facebook .bin);
writes.py: output files written atomically, whose failed writes say what and how far."""

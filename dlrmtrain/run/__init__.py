"""A run's life, from claiming its directory to its last record.

  lifecycle.py   the one object the Trainer asks: start, abort of a start, stop, finish
  identity.py    run id and the fingerprint of the math-changing config
  directory.py   the run and checkpoint directories: whose they are (claim_run_dir)
  lock.py        one run per directory: rank 0 holds an fcntl lock for the run's life
  rank0.py       what rank 0 decides at the start, handed to every rank (or the same error)
  records.py     metrics.jsonl, summary.json and the other files a run writes
  checkpoint.py  atomic, verified checkpoints; retention; size against free space
  resume.py      a resume with nothing to train or no checkpoint to load: refused, or a no-op
  cadence.py     when a run ends, evaluates and checkpoints (in optimizer steps)
  leftovers.py   temporary folders of writers that died
  signals.py     SIGTERM / SIGINT: stop at a step boundary, say where, exit 128+signal
  parent.py      a rank never outlives its launcher, nor a launcher its mlperf runner
  stop.py        a rank that stops the job on purpose tells the others why
  peers.py       a heartbeat through the job's store; a peer that died, froze or stalls, named
  failure.py     the error a rank ends with when its run cannot go on, the same on every rank
  teardown.py    what a failed start or a stopped run leaves behind (its records, its MLPerf log)
  progress.py    the per-step state of Trainer.train and the closing summary
  console.py     what a person reads: the compact plan and comm summary, errors on their own line
  errors.py      the errors a user can act on, and the exit codes they map to

The Trainer builds on this package, never the other way round: run/ imports
the config, torch, comm/ (console.py, for the codec registry) and optim/ (machine.py, for
the optimizer state's size), nothing above (docs/design.md's layers); the MLPerf log,
above it, is opened by a function the Trainer hands the lifecycle.
"""

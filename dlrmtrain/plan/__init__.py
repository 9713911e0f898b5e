"""`dlrmtrain plan`: what a run of a config needs on a cluster of GPUs that need not exist,
before any rank starts: the sharding plan TorchRec's planner makes for that cluster, each
GPU's memory by part, a verdict, and when it does not fit, what would (remedies.py). CPU
only, nothing allocated: the tables and dense layers are built on the meta device.

sizing.py: the config's facts and the memory of each rank of a plan; remedies.py: more GPUs,
a smaller local batch, UVM caching, a lighter setting of the family; command.py: the command.
"""

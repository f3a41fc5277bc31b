"""Scale-out: expert parallelism over torch.distributed."""

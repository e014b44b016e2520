"""Linear-recurrence kernels with state in and state out (Triton, with pure-PyTorch references)."""

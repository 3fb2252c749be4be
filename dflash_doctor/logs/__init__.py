"""Reading a training log of any size in constant memory: thread deaths, known errors, throughput, stalls."""

# src/comm: gradient buckets and their overlapped all-reduce.
ddp_add_mpi_test(test_gradient_reducer SOURCES comm/test_gradient_reducer.cpp NP 1 2 3 4 LABELS comm)

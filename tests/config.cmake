# Input file, configuration, optimizers and learning-rate schedules.
ddp_add_test(test_namelist SOURCES unit/test_namelist.cpp)
ddp_add_test(test_config SOURCES unit/test_config.cpp)
ddp_add_test(test_optimizer SOURCES unit/test_optimizer.cpp)

# Checkpoints, resume, preemption (SIGUSR1 -> exit 75), crash safety, PyTorch interop, --check.
set(CKPT ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint)
set(CKPT_MPIEXEC ${MPIEXEC_EXECUTABLE})

ddp_add_test(test_checkpoint SOURCES checkpoint/test_checkpoint.cpp checkpoint/test_run_dir_lock.cpp
             LABELS checkpoint)
# The checkpoint a run starts from, received by every rank; under ZeRO each its share.
ddp_add_mpi_test(test_start_checkpoint SOURCES checkpoint/test_start_checkpoint.cpp NP 1 2 3 LABELS checkpoint)

# ddp_add_checkpoint_test(name FIXTURE f NP n TIMEOUT t COMMAND ...): a driver script.
function(ddp_add_checkpoint_test name)
  cmake_parse_arguments(T "" "NP;TIMEOUT" "FIXTURE;COMMAND;SETS" ${ARGN})
  add_test(NAME checkpoint_${name} COMMAND ${T_COMMAND})
  set_tests_properties(checkpoint_${name} PROPERTIES FIXTURES_REQUIRED "${T_FIXTURE}" LABELS "e2e;checkpoint"
                       TIMEOUT ${T_TIMEOUT} PROCESSORS ${T_NP})
  if(T_SETS)
    set_tests_properties(checkpoint_${name} PROPERTIES FIXTURES_SETUP "${T_SETS}")
  endif()
endfunction()

set(FASHION_NML ${PROJECT_SOURCE_DIR}/inputs/fashion_mlp.nml)
ddp_add_checkpoint_test(exactness_np2 FIXTURE fashion NP 2 TIMEOUT 900 SETS ckpt_fashion_run
  COMMAND ${DDP_PYTHON} ${CKPT}/exactness.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${FASHION_NML} runs/ckpt_exact
          ${FASHION_ONE_SHARD})
# fp16 with a scale that overflows at first and grows every 50 clean steps: the
# stop lands between changes of the scale, which the checkpoint must carry.
ddp_add_checkpoint_test(exactness_fp16_np2 FIXTURE fashion NP 2 TIMEOUT 900
  COMMAND ${DDP_PYTHON} ${CKPT}/exactness.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${FASHION_NML}
          runs/ckpt_exact_fp16 train.precision=fp16 train.loss_scale=1048576 train.loss_scale_growth_interval=50)
if(DDP_ENABLE_CUDA)
  # train.cuda_graph on the GPU (skipped, 77, without a device): 2 epochs replayed from
  # CUDA graphs end bitwise where the uncaptured run ends (MLP and CNN), and a stop and
  # resume with graphs on equals the straight run (fp32, and fp16 with its loss scale).
  ddp_add_checkpoint_test(cuda_graph_equal_np2 FIXTURE fashion NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/graph_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            runs/ckpt_graph ${FASHION_NML} ${PROJECT_SOURCE_DIR}/inputs/fashion_cnn.nml)
  ddp_add_checkpoint_test(exactness_cuda_graph_np2 FIXTURE fashion NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/exactness.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            ${FASHION_NML} runs/ckpt_exact_graph train.cuda_graph=on)
  ddp_add_checkpoint_test(exactness_fp16_cuda_graph_np2 FIXTURE fashion NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/exactness.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            ${FASHION_NML} runs/ckpt_exact_fp16_graph train.precision=fp16 train.loss_scale=1048576
            train.loss_scale_growth_interval=50 train.cuda_graph=on)
  # The same for fashion_resnet in bf16 with its batch norms on cuDNN's
  # (DDP_CUDNN_BATCHNORM=1): captured, they replay bitwise as they run uncaptured.
  ddp_add_checkpoint_test(cuda_graph_equal_cudnn_batchnorm_np2 FIXTURE fashion NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/graph_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            runs/ckpt_graph_cudnn_bn ${PROJECT_SOURCE_DIR}/inputs/fashion_resnet.nml -- train.precision=bf16)
  set_tests_properties(checkpoint_cuda_graph_equal_np2 checkpoint_exactness_cuda_graph_np2
                       checkpoint_exactness_fp16_cuda_graph_np2 checkpoint_cuda_graph_equal_cudnn_batchnorm_np2
                       PROPERTIES SKIP_RETURN_CODE 77)
  set_tests_properties(checkpoint_cuda_graph_equal_cudnn_batchnorm_np2 PROPERTIES ENVIRONMENT
                       DDP_CUDNN_BATCHNORM=1)
endif()
# val_acc after 4 epochs: 0.85 on the whole set; 0.78 on one shard under the sanitizers
# (FASHION_ONE_SHARD; 0.824 after 4 epochs on 2 ranks).
if(DDP_SANITIZE)
  set(_any_world_size_acc 0.78)
else()
  set(_any_world_size_acc 0.85)
endif()
ddp_add_checkpoint_test(any_world_size_np2_np3 FIXTURE fashion NP 3 TIMEOUT 900
  COMMAND ${DDP_PYTHON} ${CKPT}/any_world_size.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${FASHION_NML}
          runs/ckpt_any_world_size ${_any_world_size_acc} ${FASHION_ONE_SHARD})
ddp_add_checkpoint_test(interop_pytorch FIXTURE fashion ckpt_fashion_run NP 1 TIMEOUT 300
  COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${CKPT}/interop.py runs/ckpt_exact_straight
          "data/fashion-mnist/test_*.h5")
set_tests_properties(checkpoint_interop_pytorch PROPERTIES SKIP_RETURN_CODE 77)
# ddp_train --evaluate on that run's checkpoints, on 1 to 3 ranks: its metrics.jsonl
# records bitwise, nothing written, and its three errors in one line each.
ddp_add_checkpoint_test(evaluate_np3 FIXTURE fashion ckpt_fashion_run NP 3 TIMEOUT 300
  COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${CKPT}/evaluate.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
          ${FASHION_NML} runs/ckpt_exact_straight)
set_tests_properties(checkpoint_evaluate_np3 PROPERTIES SKIP_RETURN_CODE 77)
# io.init_from with a weights-only file made by tools/torch_to_h5 from a PyTorch
# state_dict: the first step's loss equals PyTorch's; a missing or misshapen tensor is
# one error line and exit 1 on every rank.
if(DDP_TORCH_PYTHON)
  ddp_add_checkpoint_test(init_from_pytorch_np2 NP 2 TIMEOUT 180
    COMMAND ${DDP_TORCH_PYTHON} ${CKPT}/torch_init.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 runs/torch_init)
endif()
# train.clip_grad_norm: one step of a conv + batch norm + linear model against
# torch.nn.utils.clip_grad_norm_ and SGD, clipping and not, on 1 and 2 ranks.
if(DDP_TORCH_PYTHON)
  foreach(np 1 2)
    ddp_add_checkpoint_test(clip_step_np${np} NP ${np} TIMEOUT 180
      COMMAND ${DDP_TORCH_PYTHON} ${CKPT}/clip_step.py ${np} ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
              ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 runs/clip_step_np${np})
  endforeach()
  # ZeRO stage 2: each rank sums its share's blocks of the norm; the same step.
  ddp_add_checkpoint_test(clip_step_zero2_np2 NP 2 TIMEOUT 180
    COMMAND ${DDP_TORCH_PYTHON} ${CKPT}/clip_step.py 2 ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 runs/clip_step_zero2_np2 comm.zero=2)
endif()
# One AdamW step (with clipping) of a nanoGPT-shaped GPT with its tied head and of
# torchvision's VisionTransformer from PyTorch's weights (torch_to_h5's name tables),
# against PyTorch's step, on 1 and 2 ranks (tests/checkpoint/transformer_step.py).
if(DDP_TORCH_PYTHON)
  foreach(kind gpt vit)
    foreach(np 1 2)
      ddp_add_checkpoint_test(transformer_step_${kind}_np${np} NP ${np} TIMEOUT 180
        COMMAND ${DDP_TORCH_PYTHON} ${CKPT}/transformer_step.py ${kind} ${np} ${CKPT_MPIEXEC}
                $<TARGET_FILE:ddp_train> ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 runs/transformer_step_${kind}_np${np})
      set_tests_properties(checkpoint_transformer_step_${kind}_np${np} PROPERTIES LABELS "e2e;checkpoint;lm")
    endforeach()
  endforeach()
endif()
# ZeRO stages 1 and 2 bitwise equal to plain data parallelism (tests/checkpoint/zero_equal.py).
foreach(np 1 2 3 4)
  ddp_add_checkpoint_test(zero_equal_np${np} FIXTURE e2e_data NP ${np} TIMEOUT 300
    COMMAND ${DDP_PYTHON} ${CKPT}/zero_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${E2E}/tiny.nml
            runs/zero_equal_np${np} ${np})
endforeach()
# A checkpoint written at zero = 2 on 3 ranks: the same file as at zero = 0; resumed at
# zero = 0 on 2 ranks and zero = 1 on 4; loads into PyTorch (interop.py).
ddp_add_checkpoint_test(zero_resume FIXTURE fashion NP 4 TIMEOUT 600
  COMMAND ${DDP_PYTHON} ${CKPT}/zero_resume.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${FASHION_NML}
          runs/zero_resume "data/fashion-mnist/test_*.h5")
# One step of inputs/resnet50_tiny.nml from torchvision's resnet50 (its state_dict
# through tools/torch_to_h5) against PyTorch's step, on 1 and 2 ranks.
if(DDP_TORCH_PYTHON)
  # On 2 ranks of the CPU build the step runs again with the activations channels-last
  # (DDP_CONV_LAYOUT=nhwc: oneDNN on nhwc, the batch norms, pools and blocks on it too),
  # the layout the GPU build keeps in bf16/fp16, against the same PyTorch step.
  foreach(np 1 2)
    set(_extra "")
    if(np EQUAL 2 AND NOT DDP_ENABLE_CUDA)
      set(_extra --nhwc-too)
    endif()
    ddp_add_checkpoint_test(resnet50_step_np${np} NP ${np} TIMEOUT 300
      COMMAND ${DDP_TORCH_PYTHON} ${CKPT}/resnet50_step.py ${np} ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
              ${PROJECT_SOURCE_DIR}/tools/torch_to_h5 ${PROJECT_SOURCE_DIR}/inputs/resnet50_tiny.nml
              runs/resnet50_step_np${np} ${_extra})
  endforeach()
endif()
# A checkpoint an earlier build wrote (tests/checkpoint/fixtures/ckpt_v1.h5, format_version
# 1: conv, batch norm, dropout, AdamW, cosine, stopped mid-epoch on 2 ranks), resumed on 2
# ranks ('auto') and on 1 (io.resume = its path) and as io.init_from, continues bitwise as
# that build continued it (fixtures/fixture_v1_expected.*) where this build's arithmetic
# is the recording's (ddp_train --version: build type and compiler, FMA or not, Kokkos,
# oneDNN), within a tolerance per dataset elsewhere. CPU build: the recording is the CPU
# build's arithmetic.
if(NOT DDP_ENABLE_CUDA)
  ddp_add_checkpoint_test(fixture_v1 NP 2 TIMEOUT 300
    COMMAND ${DDP_PYTHON} ${CKPT}/fixture_v1.py check ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>)
endif()
ddp_add_checkpoint_test(crash_safety FIXTURE e2e_data NP 2 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/crash_safety.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_crash)
# io.keep_best on the tiny set (2 ranks, 3 for --evaluate): checkpoints/best.h5 names
# the best validation's checkpoint through keep-1, a resume, the background writer and
# a change of metric; its bad inputs are one line each.
ddp_add_checkpoint_test(best_np3 FIXTURE e2e_data regression NP 3 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/best.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY}
          ${PROJECT_SOURCE_DIR}/inputs/regression.nml runs/ckpt_best)
# Faults (issue 11): a disk that fills up (run_dir on a small tmpfs; skipped, exit
# 77, where mount(8) is not allowed), shards that changed between a stop and its
# resume, a checkpoint with NaN weights.
ddp_add_checkpoint_test(disk_full FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/disk_full.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_disk_full)
set_tests_properties(checkpoint_disk_full PROPERTIES SKIP_RETURN_CODE 77)
# A file system slow to write (an ext4 on a throttled loop device; skipped, exit 77,
# without root or the throttle): a checkpoint that takes three times comm.timeout_s
# and moves on is waited for; one that does not move on within it is named.
ddp_add_checkpoint_test(slow_disk FIXTURE e2e_data NP 2 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/slow_disk.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_slow_disk)
set_tests_properties(checkpoint_slow_disk PROPERTIES SKIP_RETURN_CODE 77)
ddp_add_checkpoint_test(data_change FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/data_change.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_data_change
          e2e_data/tiny)
# A shard written over in place under a running job (cp over it, a truncation) ends
# the run at the epoch's end in one line; a rename over it does not.
ddp_add_checkpoint_test(data_rewritten FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/data_rewritten.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY}
          runs/ckpt_data_rewritten e2e_data/tiny)
ddp_add_checkpoint_test(nonfinite FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/nonfinite.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_nonfinite)
ddp_add_checkpoint_test(cadence FIXTURE e2e_data NP 2 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/cadence.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/ckpt_cadence)
ddp_add_checkpoint_test(check_option FIXTURE e2e_data NP 2 TIMEOUT 90
  COMMAND ${CKPT}/check_option.sh runs/ckpt_check --
          ${DDP_RUN} 2 $<TARGET_FILE:ddp_train> --check ${TINY} io.run_dir=runs/ckpt_check)
# --check finds bad data like a run does: one error line, non-zero exit.
ddp_add_error_test(check_bad_labels NP 2 REGEX "badlabels/train_001.h5.*17.*7"
                   ARGS --check ${TINY} "data.train_files=e2e_data/badlabels/train_*.h5")
# Stops at random moments of a 2-rank run, preloaded and streamed: every one ends in
# exit 75 with its checkpoint and resumes, and nothing corrupts the heap on the way out
# (a SIGUSR1 handler inside oneDNN's AVX2 sgemm once did: exit 134). tools/sanitize_tests
# runs 30 of these under AddressSanitizer.
ddp_add_checkpoint_test(stop_stress_np2 FIXTURE fashion NP 2 TIMEOUT 600
  COMMAND ${DDP_PYTHON} ${CKPT}/stop_stress.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${FASHION_NML}
          runs/stop_stress --runs 6 --max-delay 4)
# Exit 75 from every rank under mpiexec, which answers the first rank's exit 75 with
# SIGTERM to the others 1 s later and SIGKILL 1 s after that: a rank 8 s slow to exit
# (DDP_TEST_EXIT_DELAY_MS, after MPI_Finalize) exits 75 too and the checkpoint resumes;
# a SIGTERM after the stop's checkpoint ends a rank at once with 75, one during the
# checkpoint's write once the checkpoint is complete. Each rank's own exit status is
# recorded by rank_status.py (the slow rank's was 137 before the SIGTERM was honoured).
ddp_add_checkpoint_test(exit75_slow_exit_np2 FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/exit75.py slow_exit ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY} runs/exit75)
ddp_add_checkpoint_test(exit75_second_sigterm_np2 FIXTURE e2e_data NP 2 TIMEOUT 180
  COMMAND ${DDP_PYTHON} ${CKPT}/exit75.py second_sigterm ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${TINY}
          runs/exit75)

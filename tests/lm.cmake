# Language models end to end (label "lm" beside e2e/checkpoint/errors): token shards
# of a seeded synthetic language (tools/make_markov_tokens), inputs/gpt_tiny.nml on them.
set(_lm_tools ${PROJECT_SOURCE_DIR}/tools)
set(_lm_layers ${CMAKE_CURRENT_SOURCE_DIR}/layers)
set(GPT_TINY ${PROJECT_SOURCE_DIR}/inputs/gpt_tiny.nml)

# The data: 500,000 tokens (7,812 windows of 64) to learn from; 99,841 (1,560 windows,
# a multiple of 2 and 3 ranks' batches, so no epoch pads) for the stop-and-resume
# tests; broken shards for the error lines.
add_test(NAME lm_make_markov_tokens
         COMMAND ${DDP_PYTHON} ${_lm_tools}/make_markov_tokens e2e_data/markov --vocab 16 --order 2 --train 500000
                 --val 50000 --shard-tokens 250000 --seq-len 64)
set_tests_properties(lm_make_markov_tokens PROPERTIES FIXTURES_SETUP markov LABELS "e2e;lm" TIMEOUT 120)
add_test(NAME lm_make_markov_small
         COMMAND ${DDP_PYTHON} ${_lm_tools}/make_markov_tokens e2e_data/markov_small --vocab 16 --order 2 --train 99841
                 --val 10000 --seq-len 64)
set_tests_properties(lm_make_markov_small PROPERTIES FIXTURES_SETUP markov_small LABELS "e2e;lm" TIMEOUT 120)
add_test(NAME lm_make_token_shards COMMAND ${DDP_PYTHON} ${_lm_layers}/make_token_shards.py e2e_data/bad_tokens)
set_tests_properties(lm_make_token_shards PROPERTIES FIXTURES_SETUP bad_tokens LABELS "e2e;lm" TIMEOUT 60)
set(_markov "data.train_files=e2e_data/markov/train_*.h5" "data.val_files=e2e_data/markov/val_*.h5")
set(_markov_small "data.train_files=e2e_data/markov_small/train_*.h5" "data.val_files=e2e_data/markov_small/val_*.h5")

# Learning: gpt_tiny on 2 ranks ends within 5% of the source's entropy rate (1.2274
# nats/token; a model that sees 64 tokens can reach 1.2478), its validation records
# a language model's (val_ppl, val_tokens, token accuracy).
ddp_add_train_test(gpt_tiny_np2 NP 2 RUN_DIR runs/gpt_tiny FIXTURE markov CHECK "--epochs 4 --loss-falls"
                   ARGS ${GPT_TINY} ${_markov})
set_tests_properties(e2e_gpt_tiny_np2 PROPERTIES FIXTURES_SETUP gpt_tiny_run LABELS "e2e;lm")
add_test(NAME lm_gpt_tiny_learns
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${_lm_layers}/check_lm_learns.py runs/gpt_tiny
                 e2e_data/markov/val_000.h5 64 0.05)
set_tests_properties(lm_gpt_tiny_learns PROPERTIES FIXTURES_REQUIRED "markov;gpt_tiny_run" LABELS "e2e;lm"
                     TIMEOUT 60 SKIP_RETURN_CODE 77)
# The checkpoint holds the blocks' parameters in EncoderBlock's names and shapes.
set(_gpt_params 0.weight=16x64 1.weight=64x64 4.weight=64 4.bias=64 5.weight=16x64 5.bias=16)
foreach(_b 2 3)
  list(APPEND _gpt_params ${_b}.ln_1.weight=64 ${_b}.ln_1.bias=64 ${_b}.self_attention.in_proj_weight=192x64
       ${_b}.self_attention.in_proj_bias=192 ${_b}.self_attention.out_proj.weight=64x64
       ${_b}.self_attention.out_proj.bias=64 ${_b}.ln_2.weight=64 ${_b}.ln_2.bias=64 ${_b}.mlp.0.weight=256x64
       ${_b}.mlp.0.bias=256 ${_b}.mlp.3.weight=64x256 ${_b}.mlp.3.bias=64)
endforeach()
add_test(NAME lm_gpt_tiny_checkpoint
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${_lm_layers}/check_checkpoint_params.py runs/gpt_tiny
                 ${_gpt_params} --trained 2.ln_1.bias 3.ln_2.bias 3.self_attention.in_proj_bias 4.bias)
set_tests_properties(lm_gpt_tiny_checkpoint PROPERTIES FIXTURES_REQUIRED gpt_tiny_run LABELS "e2e;lm;checkpoint"
                     TIMEOUT 60 SKIP_RETURN_CODE 77)

# Windows streamed (one read of seq_len + 1 tokens each) and preloaded: the same run.
ddp_add_train_test(gpt_tiny_stream NP 2 RUN_DIR runs/gpt_tiny_stream FIXTURE markov_small CHECK "--epochs 2"
                   ARGS ${GPT_TINY} ${_markov_small} train.epochs=2 data.mode=stream data.prefetch_batches=2)
ddp_add_train_test(gpt_tiny_preload NP 2 RUN_DIR runs/gpt_tiny_preload FIXTURE markov_small CHECK "--epochs 2"
                   ARGS ${GPT_TINY} ${_markov_small} train.epochs=2 data.mode=preload)
set_tests_properties(e2e_gpt_tiny_stream e2e_gpt_tiny_preload PROPERTIES FIXTURES_SETUP lm_stream_vs_preload
                     LABELS "e2e;lm")
add_test(NAME lm_stream_equals_preload
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${E2E}/compare_metrics.py runs/gpt_tiny_stream
                 runs/gpt_tiny_preload train_loss val_loss val_acc val_correct val_tokens step)
set_tests_properties(lm_stream_equals_preload PROPERTIES FIXTURES_REQUIRED lm_stream_vs_preload LABELS "e2e;lm"
                     SKIP_RETURN_CODE 77)

# Token sets users already have: llm.c's files (tools/llmc_to_h5) and text
# (tools/text_to_tokens), their formats and refusals; the small set through llm.c's
# format and back holds the very tokens of the original, and ddp_train takes it.
add_test(NAME lm_token_tools COMMAND ${DDP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tools/token_tools_test.py ${_lm_tools}
                                     token_tools_test)
set_tests_properties(lm_token_tools PROPERTIES LABELS "tools;lm" TIMEOUT 120 PASS_REGULAR_EXPRESSION
                     "token_tools_test: all passed")
add_test(NAME lm_make_llmc_shards
         COMMAND ${DDP_PYTHON} ${_lm_layers}/make_llmc_shards.py e2e_data/markov_small e2e_data/markov_llmc
                 ${_lm_tools}/llmc_to_h5)
set_tests_properties(lm_make_llmc_shards PROPERTIES FIXTURES_REQUIRED markov_small FIXTURES_SETUP markov_llmc
                     LABELS "e2e;lm" TIMEOUT 120)
add_test(NAME lm_llmc_shards_check
         COMMAND ${DDP_RUN} 1 $<TARGET_FILE:ddp_train> --check ${GPT_TINY} "data.train_files=e2e_data/markov_llmc/train_*.h5"
                 "data.val_files=e2e_data/markov_llmc/val_*.h5" io.run_dir=runs/llmc_check)
set_tests_properties(lm_llmc_shards_check PROPERTIES FIXTURES_REQUIRED markov_llmc LABELS "e2e;lm" TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "data: 1560 training samples.*check passed")

# A byte-level BPE (tools/text_to_tokens --bpe / --tokenizer, Hugging Face's tokenizers
# from the venv tools/install_deps --test makes; skipped, 77, without it) on this
# project's manual (tests/tools/bpe_tokens_test.py), and ddp_train's start-up check of
# its shards: 512 ids, the vocabulary table, a model of that vocabulary.
ddp_find_python(DDP_TOKENIZERS_PYTHON "import tokenizers, h5py, numpy" "python3 with tokenizers, for the BPE test"
                /opt/ddp_train-venv/bin/python3 ${DDP_PYTHON})
if(NOT DDP_TOKENIZERS_PYTHON)
  set(DDP_TOKENIZERS_PYTHON ${DDP_PYTHON})  # the script exits 77
endif()
add_test(NAME lm_bpe_tokens COMMAND ${DDP_TOKENIZERS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tools/bpe_tokens_test.py
                                    ${_lm_tools} ${PROJECT_SOURCE_DIR}/docs e2e_data/bpe_tokens_test)
set_tests_properties(lm_bpe_tokens PROPERTIES FIXTURES_SETUP bpe_tokens LABELS "tools;lm" TIMEOUT 120
                     SKIP_RETURN_CODE 77 PASS_REGULAR_EXPRESSION "bpe_tokens_test: all passed")
add_test(NAME lm_bpe_shards_check
         COMMAND ${DDP_RUN} 1 $<TARGET_FILE:ddp_train> --check ${GPT_TINY}
                 "data.train_files=e2e_data/bpe_tokens_test/bpe/train_*.h5"
                 "data.val_files=e2e_data/bpe_tokens_test/bpe/val_*.h5" io.run_dir=runs/bpe_check
                 "model.layers=embedding(512,64),pos_embedding(64),transformer_block(4,causal,tanh),layernorm,linear(512,bias=false,tied)")
set_tests_properties(lm_bpe_shards_check PROPERTIES FIXTURES_REQUIRED bpe_tokens LABELS "e2e;lm" TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "data: [0-9]+ training samples of shape \\(64\\).*check passed")

# Real text: this project's manual as bytes (tools/text_to_tokens), a byte-level GPT of
# gpt_tiny's shape with the tied head, 2 epochs on 2 ranks: the validation loss 10%
# below the bytes' unigram entropy (it reads context, not frequencies; 2.89 against
# 3.42 nats on a 2-core EPYC, 0.85 of it), and the text it
# writes (io.sample_tokens) printed and in samples.txt, decoded through the shards'
# vocabulary.
file(GLOB _manual ${PROJECT_SOURCE_DIR}/docs/*.md)
add_test(NAME lm_text_to_tokens COMMAND ${DDP_PYTHON} ${_lm_tools}/text_to_tokens ${PROJECT_SOURCE_DIR}/README.md
                                        ${_manual} e2e_data/manual_bytes --val-fraction 0.1)
set_tests_properties(lm_text_to_tokens PROPERTIES FIXTURES_SETUP manual_bytes LABELS "e2e;lm" TIMEOUT 120)
ddp_add_train_test(manual_bytes_np2 NP 2 RUN_DIR runs/manual_bytes FIXTURE manual_bytes CHECK "--epochs 2"
                   ENV "DDP_EXPECT_LOG=^sample .epoch 2, 64 tokens after 32 of the validation set's first window.: "
                   ARGS ${GPT_TINY} "data.train_files=e2e_data/manual_bytes/train_*.h5"
                        "data.val_files=e2e_data/manual_bytes/val_*.h5" train.epochs=2 io.sample_tokens=64
                        "model.layers=embedding(257,64,std=0.02),pos_embedding(64,std=0.02),transformer_block(4,causal,tanh),transformer_block(4,causal,tanh),layernorm,linear(257,bias=false,tied)")
set_tests_properties(e2e_manual_bytes_np2 PROPERTIES FIXTURES_SETUP manual_bytes_run LABELS "e2e;lm")
add_test(NAME lm_manual_bytes_learns
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${_lm_layers}/check_lm_learns.py runs/manual_bytes
                 e2e_data/manual_bytes/val_000.h5 64 0.1 --unigram --samples 64)
set_tests_properties(lm_manual_bytes_learns PROPERTIES FIXTURES_REQUIRED "manual_bytes;manual_bytes_run"
                     LABELS "e2e;lm" TIMEOUT 60 SKIP_RETURN_CODE 77)

# GPT-2's tied head (linear(16, bias=false, tied): its weight the embedding's table) on
# 2 ranks: the loss falls, and the checkpoint holds the table once, as layers.0.weight.
ddp_add_train_test(gpt_tiny_tied_np2 NP 2 RUN_DIR runs/gpt_tiny_tied FIXTURE markov_small
                   CHECK "--epochs 2 --loss-falls"
                   ARGS ${GPT_TINY} ${_markov_small} train.epochs=2
                        "model.layers=embedding(16,64),pos_embedding(64),transformer_block(4,causal,tanh),transformer_block(4,causal,tanh),layernorm,linear(16,bias=false,tied)")
set_tests_properties(e2e_gpt_tiny_tied_np2 PROPERTIES FIXTURES_SETUP gpt_tiny_tied_run LABELS "e2e;lm")
list(FILTER _gpt_params EXCLUDE REGEX "^5\\.")
add_test(NAME lm_gpt_tiny_tied_checkpoint
         COMMAND ${DDP_RUN_NEEDS_DEVICE} ${DDP_PYTHON} ${_lm_layers}/check_checkpoint_params.py runs/gpt_tiny_tied
                 ${_gpt_params} --trained 4.bias)
set_tests_properties(lm_gpt_tiny_tied_checkpoint PROPERTIES FIXTURES_REQUIRED gpt_tiny_tied_run
                     LABELS "e2e;lm;checkpoint" TIMEOUT 60 SKIP_RETURN_CODE 77)

# Stop (SIGUSR1) mid-epoch and resume: bitwise the straight run; and resumed on 3
# ranks from 2, every window of the stopped epoch trained exactly once.
ddp_add_checkpoint_test(exactness_gpt_tiny_np2 FIXTURE markov_small NP 2 TIMEOUT 600
  COMMAND ${DDP_PYTHON} ${CKPT}/exactness.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${GPT_TINY}
          runs/ckpt_exact_gpt ${_markov_small})
ddp_add_checkpoint_test(any_world_size_gpt_tiny_np2_np3 FIXTURE markov_small NP 3 TIMEOUT 600
  COMMAND ${DDP_PYTHON} ${CKPT}/any_world_size.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${GPT_TINY}
          runs/ckpt_any_world_size_gpt 0.4 ${_markov_small})
set_tests_properties(checkpoint_exactness_gpt_tiny_np2 checkpoint_any_world_size_gpt_tiny_np2_np3 PROPERTIES
                     LABELS "e2e;checkpoint;lm")

# ZeRO stages 1 and 2 bitwise equal to stage 0 with the transformer layers (the MLP's
# zero_equal, --own-model): gpt_tiny (its AdamW with clipping) and a small ViT, fp32
# and bf16 with 2 micro-steps, through shared memory and through MPI, 1 epoch on 2 ranks.
# Under the sanitizers (DDP_SANITIZE) the 12 runs of each train on the validation set
# (156 windows, 320 images: 5 steps an epoch) for 2 epochs: every path of the full
# runs, an epoch's end among them, without 49 and 20 steps of GEMMs under ASan (92 s
# and 28 s of the sanitizer job, gpt_tiny's the longest test in it).
if(DDP_SANITIZE)
  set(_zero_gpt_data "data.train_files=e2e_data/markov_small/val_*.h5" "data.val_files=e2e_data/markov_small/val_*.h5"
                     train.epochs=2)
  set(_zero_vit_data "data.train_files=data/synthetic64/val_*.h5" "data.val_files=data/synthetic64/val_*.h5"
                     train.epochs=2)
else()
  set(_zero_gpt_data ${_markov_small} train.epochs=1)
  set(_zero_vit_data "data.train_files=data/synthetic64/train_*.h5" "data.val_files=data/synthetic64/val_*.h5"
                     train.epochs=1)
endif()
ddp_add_checkpoint_test(zero_equal_gpt_tiny_np2 FIXTURE markov_small NP 2 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/zero_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train> ${GPT_TINY}
          runs/zero_equal_gpt 2 --own-model ${_zero_gpt_data})
ddp_add_checkpoint_test(zero_equal_vit_np2 FIXTURE synthetic64 NP 2 TIMEOUT 300
  COMMAND ${DDP_PYTHON} ${CKPT}/zero_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
          ${PROJECT_SOURCE_DIR}/inputs/vit_fashion.nml runs/zero_equal_vit 2 --own-model ${_zero_vit_data}
          train.batch_size=32 "data.normalize=0.485,0.456,0.406,0.229,0.224,0.225"
          "model.layers=patch_embed(16,64),class_token,pos_embedding(17,std=0.02),transformer_block(4,eps=1e-6),layernorm(eps=1e-6),token_pool,linear(10)")
set_tests_properties(checkpoint_zero_equal_gpt_tiny_np2 checkpoint_zero_equal_vit_np2 PROPERTIES
                     LABELS "e2e;checkpoint;lm")

# The GPU build (skipped, 77, without a device): gpt_tiny and the small ViT replayed from
# CUDA graphs end bitwise where their uncaptured runs end (graph_equal.py, 2 epochs).
if(DDP_ENABLE_CUDA)
  ddp_add_checkpoint_test(cuda_graph_equal_gpt_tiny_np2 FIXTURE markov_small NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/graph_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            runs/ckpt_graph_gpt ${GPT_TINY} -- ${_markov_small})
  ddp_add_checkpoint_test(cuda_graph_equal_vit_np2 FIXTURE synthetic64 NP 2 TIMEOUT 900
    COMMAND ${DDP_WITH_GPU} ${DDP_PYTHON} ${CKPT}/graph_equal.py ${CKPT_MPIEXEC} $<TARGET_FILE:ddp_train>
            runs/ckpt_graph_vit ${PROJECT_SOURCE_DIR}/inputs/vit_fashion.nml --
            "data.train_files=data/synthetic64/train_*.h5" "data.val_files=data/synthetic64/val_*.h5"
            train.batch_size=32 "data.normalize=0.485,0.456,0.406,0.229,0.224,0.225"
            "model.layers=patch_embed(16,64),class_token,pos_embedding(17,std=0.02),transformer_block(4,eps=1e-6),layernorm(eps=1e-6),token_pool,linear(10)")
  set_tests_properties(checkpoint_cuda_graph_equal_gpt_tiny_np2 checkpoint_cuda_graph_equal_vit_np2 PROPERTIES
                       SKIP_RETURN_CODE 77 LABELS "e2e;checkpoint;lm;gpu")
endif()

# Bad input: one line each, naming the culprit, no rank left waiting.
function(lm_error_test name fixture regex)
  ddp_add_error_test(${name} NP 2 REGEX "${regex}" ARGS ${ARGN})
  set_tests_properties(e2e_error_${name} PROPERTIES FIXTURES_REQUIRED "e2e_data;${fixture}"
                       LABELS "e2e;errors;lm")
endfunction()
set(_bad e2e_data/bad_tokens)
lm_error_test(token_outside_vocab "markov;bad_tokens"
              "bad_id/train_000.h5: token /tokens\\[1234\\] = 20 is outside .0, 16\\): the model's output \\(16 logits a token\\) has no such token"
              ${GPT_TINY} ${_markov} "data.train_files=${_bad}/bad_id/train_*.h5" train.batch_size=4)
lm_error_test(token_shard_short "markov;bad_tokens"
              "short/train_000.h5: 40 tokens, fewer than one sample's window of data.seq_len \\+ 1 = 65"
              ${GPT_TINY} ${_markov} "data.train_files=${_bad}/short/train_*.h5")
lm_error_test(token_no_vocab_size "markov;bad_tokens" "novocab/train_000.h5: /tokens needs the root attribute vocab_size"
              ${GPT_TINY} ${_markov} "data.train_files=${_bad}/novocab/train_*.h5")
lm_error_test(token_vocab_above_model "markov;bad_tokens"
              "bigvocab/train_000.h5: attribute vocab_size = 50257 .*model's vocabulary must hold the shards'"
              ${GPT_TINY} ${_markov} "data.train_files=${_bad}/bigvocab/train_*.h5" train.batch_size=4)
lm_error_test(token_and_x "markov;bad_tokens" "both/train_000.h5: holds both /tokens and /x"
              ${GPT_TINY} ${_markov} "data.train_files=${_bad}/both/train_*.h5")
lm_error_test(embedding_smaller_than_shards markov "vocab_size = 16 .*the model's embedding\\(8, 64\\)"
              ${GPT_TINY} ${_markov} "model.layers=embedding(8,64),pos_embedding(64),layernorm,linear(16)")
lm_error_test(seq_len_above_positions markov
              "pos_embedding\\(64\\) has 64 positions but the sequence has 128 tokens \\(data.seq_len\\)"
              ${GPT_TINY} ${_markov} data.seq_len=128)
lm_error_test(heads_not_dividing markov "transformer_block.*the features \\(64\\)"
              ${GPT_TINY} ${_markov} "model.layers=embedding(16,64),transformer_block(5,causal),linear(16)")
lm_error_test(tied_head_vocabulary markov
              "model.layers\\(4\\) = 'linear\\(32, tied\\)': a tied head's weight is model.layers\\(1\\) embedding\\(16, 64\\)'s table, \\(16, 64\\), but this head needs \\(32, 64\\)"
              ${GPT_TINY} ${_markov} "model.layers=embedding(16, 64),pos_embedding(64),layernorm,linear(32, tied)")
lm_error_test(tokens_into_linear markov "model.layers\\(1\\) linear\\(16\\) takes floats, but the shards .* hold token ids"
              ${GPT_TINY} ${_markov} "model.layers=linear(16),linear(16)")
lm_error_test(lm_output_not_per_token markov "token shards need the model to give \\(seq_len, vocabulary\\) logits"
              ${GPT_TINY} ${_markov} "model.layers=embedding(16,8),flatten,linear(16)")
lm_error_test(token_shards_without_seq_len markov "markov/train_000.h5 holds token ids \\(/tokens\\): set data.seq_len"
              ${GPT_TINY} ${_markov} data.seq_len=0)
lm_error_test(seq_len_on_samples markov "data.seq_len = 8 needs token shards \\(/tokens\\), but e2e_data/tiny"
              ${TINY} data.seq_len=8)
lm_error_test(embedding_on_samples markov "model.layers\\(1\\) embedding\\(16, 8\\) takes token ids, but the shards"
              ${TINY} "model.layers=embedding(16, 8),flatten,linear(3)")

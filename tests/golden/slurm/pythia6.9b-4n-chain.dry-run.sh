#!/bin/bash
# What `jobgen submit` runs (printed by --dry-run; `| bash` submits it).
set -euo pipefail
[ -f /fsx/jobgen/payload/<payload>/.jobgen-digest ] || { echo 'jobgen: the payload snapshot these jobs run, /fsx/jobgen/payload/<payload>, is not there: place it with jobgen render (same options, output discarded), or submit without --dry-run' >&2; exit 2; }
job_1=$(sbatch --parsable <<'JOBGEN_SCRIPT_<hash>'
#!/bin/bash
#SBATCH --job-name=pythia6.9b-compile
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=128
#SBATCH --exclusive
#SBATCH --partition=compute1
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#
# "pythia6.9b: Pythia 6.9B (32 layers, hidden 4096), TP 8, GPT-2 BPE, Neuron NeMo"
# Rendered by jobgen from "recipes/pythia6.9b.yaml" for site "trn1-pcluster"; re-render instead of editing.
# Two passes on the same nodes with the same settings: a 3-step compile pass that fills the
# compile cache, then the training pass, which resumes from the newest checkpoint in RUN_DIR.
set -uo pipefail
# Everything below is one { ... } block, which bash reads whole before running any of it: a
# script cut short (a render that died half-way into `| sbatch`) is a syntax error, not half a job.
{

# ---- values from the job spec (every one quoted by jobgen) -----------------------------------
# The node contract (jobgen/payloads/node.py says what each variable means), then the recipe's and the
# platform's environment, then the two passes' trainer arguments.
export MASTER_PORT=41000
export JOBGEN_RUN_DIR=/fsx/jobgen/runs/pythia6.9b-4n
export JOBGEN_PAYLOAD_DIR=/fsx/jobgen/payload/<payload>
export JOBGEN_PAYLOAD_DIGEST=<payload-digest>
export JOBGEN_LAUNCHER=neuron_nemo/launch.sh
export JOBGEN_WORKERS_PER_NODE=32
export JOBGEN_WORKDIR=/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling
export JOBGEN_PROGRAM=megatron_gpt_pretraining.py
export JOBGEN_COMPILE_WRAPPER=neuron_parallel_compile
export JOBGEN_COMPILE_STEPS=3
export JOBGEN_PASSES=compile
export JOBGEN_COMPILE_MODE=auto
export JOBGEN_COMPILE_CACHE=/fsx/neuron-compile-cache
export JOBGEN_LOCAL_COMPILE_CACHE=/local_storage/neuron-compile-cache
export JOBGEN_COMPILE_KEY=pythia6.9b-4n-754d15d3db081921
export JOBGEN_CACHE_VAR=NEURON_COMPILE_CACHE_URL
export JOBGEN_NODES=4
export JOBGEN_MAX_RESTARTS=10
export JOBGEN_COLLECTIVE_TIMEOUT=1800
export JOBGEN_SHARED_FS=1
export JOBGEN_MASTER_RESOLVER=nslookup
export JOBGEN_LUSTRE_MAX_DIRTY_MB=64
export JOBGEN_ACTIVATE=/home/ubuntu/aws_neuron_venv_pytorch/bin/activate
export JOBGEN_HEALTH='{"clock_max_offset_ms":100.0,"devices":{"command":["neuron-ls"],"count":16,"files":"/dev/neuron*"},"efa_interfaces":8,"local_free_gib":50.0,"max_requeues":3,"shared_free_gib":76.62,"timeout_s":20}'
export JOBGEN_DATA='{"format":"megatron","global_batch":256,"key":"data.path","planned_samples":2560000,"prefixes":["/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document"],"recipe":"recipes/pythia6.9b.yaml","seq_length":2048,"train_share":0.98,"vocab_file":"/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json","vocab_padded":50304,"vocab_size":50257}'
export FI_PROVIDER=efa
export FI_EFA_USE_DEVICE_RDMA=1
export FI_EFA_FORK_SAFE=1
export NEURON_CC_FLAGS='--model-type transformer --distribution-strategy=llm-training --enable-mixed-precision-accumulation'
export NEURON_FUSE_SOFTMAX=1
export XLA_USE_BF16=1
export NEURON_RT_STOCHASTIC_ROUNDING_EN=1
export HYDRA_FULL_ERROR=1
export BUCKET_CAP_MB=1024
export MALLOC_ARENA_MAX=128
export NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=5
export NEURON_RT_EXEC_TIMEOUT=10
export NEURON_TRANSFER_WITH_STATIC_RING_OPS=''
export TF_NUM_INTEROP_THREADS=1024
export XLA_IO_THREAD_POOL_SIZE=4
export XLA_THREAD_POOL_SIZE=4
COMPILE_ARGS=(
  --config-name=megatron_neox_config
  trainer.devices=32
  trainer.num_nodes=4
  trainer.max_epochs=null
  trainer.max_steps=3
  trainer.val_check_interval=3
  trainer.log_every_n_steps=1
  trainer.limit_val_batches=1
  trainer.limit_test_batches=1
  trainer.accumulate_grad_batches=1
  trainer.gradient_clip_val=1.0
  trainer.precision=32
  model.megatron_amp_O2=False
  model.seed=1234
  model.make_vocab_size_divisible_by=8
  model.micro_batch_size=2
  model.global_batch_size=256
  model.tensor_model_parallel_size=8
  model.pipeline_model_parallel_size=1
  model.sequence_parallel=True
  model.wrap_with_zero=False
  model.max_position_embeddings=2048
  model.encoder_seq_length=2048
  model.hidden_size=4096
  model.ffn_hidden_size=16384
  model.num_layers=32
  model.num_attention_heads=32
  model.init_method_std=0.021
  model.use_scaled_init_method=True
  model.hidden_dropout=0.0
  model.attention_dropout=0.0
  model.layernorm_epsilon=1e-05
  model.position_embedding_type=rope
  model.rotary_percentage=0.25
  model.transformer_block_type=gpt_j
  model.use_cpu_initialization=True
  model.tokenizer.vocab_file=/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json
  model.tokenizer.merge_file=/home/ubuntu/examples_datasets/gpt2/gpt2-merges.txt
  'model.data.data_prefix=[1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document]'
  model.data.num_workers=1
  model.data.seq_length=2048
  'model.data.splits_string="980,10,10"'
  model.optim.name=adamw
  model.optim.capturable=True
  model.optim.lr=0.00012
  'model.optim.betas=[0.9,0.95]'
  +model.optim.eps=1e-08
  model.optim.weight_decay=0.01
  model.optim.sched.name=CosineAnnealing
  model.optim.sched.warmup_steps=100
  model.optim.sched.constant_steps=0
  model.optim.sched.min_lr=1.2e-05
  +model.optim.sched.max_steps=10000
  +model.save_xser=True
  +model.load_xser=True
  exp_manager.explicit_log_dir=/fsx/jobgen/runs/pythia6.9b-4n/compile
  exp_manager.create_tensorboard_logger=False
  exp_manager.resume_if_exists=False
  exp_manager.resume_ignore_no_checkpoint=True
  exp_manager.create_checkpoint_callback=False
  +exp_manager.checkpoint_callback_params.dirpath=/fsx/jobgen/runs/pythia6.9b-4n/compile/checkpoints
  exp_manager.checkpoint_callback_params.monitor=step
  exp_manager.checkpoint_callback_params.mode=max
  exp_manager.checkpoint_callback_params.save_last=False
  exp_manager.checkpoint_callback_params.save_top_k=3
  async_checkpointing=False
  model.activations_checkpoint_granularity=full
  model.activations_checkpoint_method=uniform
  model.activations_checkpoint_num_layers=1
  +exp_manager.checkpoint_callback_params.every_n_train_steps=500
)
TRAIN_ARGS=(
  --config-name=megatron_neox_config
  trainer.devices=32
  trainer.num_nodes=4
  trainer.max_epochs=null
  trainer.max_steps=10000
  trainer.val_check_interval=10000
  trainer.log_every_n_steps=1
  trainer.limit_val_batches=1
  trainer.limit_test_batches=1
  trainer.accumulate_grad_batches=1
  trainer.gradient_clip_val=1.0
  trainer.precision=32
  model.megatron_amp_O2=False
  model.seed=1234
  model.make_vocab_size_divisible_by=8
  model.micro_batch_size=2
  model.global_batch_size=256
  model.tensor_model_parallel_size=8
  model.pipeline_model_parallel_size=1
  model.sequence_parallel=True
  model.wrap_with_zero=False
  model.max_position_embeddings=2048
  model.encoder_seq_length=2048
  model.hidden_size=4096
  model.ffn_hidden_size=16384
  model.num_layers=32
  model.num_attention_heads=32
  model.init_method_std=0.021
  model.use_scaled_init_method=True
  model.hidden_dropout=0.0
  model.attention_dropout=0.0
  model.layernorm_epsilon=1e-05
  model.position_embedding_type=rope
  model.rotary_percentage=0.25
  model.transformer_block_type=gpt_j
  model.use_cpu_initialization=True
  model.tokenizer.vocab_file=/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json
  model.tokenizer.merge_file=/home/ubuntu/examples_datasets/gpt2/gpt2-merges.txt
  'model.data.data_prefix=[1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document]'
  model.data.num_workers=1
  model.data.seq_length=2048
  'model.data.splits_string="980,10,10"'
  model.optim.name=adamw
  model.optim.capturable=True
  model.optim.lr=0.00012
  'model.optim.betas=[0.9,0.95]'
  +model.optim.eps=1e-08
  model.optim.weight_decay=0.01
  model.optim.sched.name=CosineAnnealing
  model.optim.sched.warmup_steps=100
  model.optim.sched.constant_steps=0
  model.optim.sched.min_lr=1.2e-05
  +model.optim.sched.max_steps=10000
  +model.save_xser=True
  +model.load_xser=True
  exp_manager.explicit_log_dir=/fsx/jobgen/runs/pythia6.9b-4n/nemo
  exp_manager.create_tensorboard_logger=True
  exp_manager.resume_if_exists=True
  exp_manager.resume_ignore_no_checkpoint=True
  exp_manager.create_checkpoint_callback=True
  +exp_manager.checkpoint_callback_params.dirpath=/fsx/jobgen/runs/pythia6.9b-4n/nemo/checkpoints
  exp_manager.checkpoint_callback_params.monitor=step
  exp_manager.checkpoint_callback_params.mode=max
  exp_manager.checkpoint_callback_params.save_last=False
  exp_manager.checkpoint_callback_params.save_top_k=3
  async_checkpointing=False
  model.activations_checkpoint_granularity=full
  model.activations_checkpoint_method=uniform
  model.activations_checkpoint_num_layers=1
  +exp_manager.checkpoint_callback_params.every_n_train_steps=500
)
# ---- end of generated values ----------------------------------------------------------------

# Relative paths are taken from the submission directory. The two-pass flow (compile marker,
# compile pass, node-local cache copy, training pass, status, requeue) is payload/common/
# job_flow.sh, the same for every executor; this script only hands it Slurm's facts.
cd "${SLURM_SUBMIT_DIR:-.}" || exit 1
case $JOBGEN_PAYLOAD_DIR in /*) flow=$JOBGEN_PAYLOAD_DIR ;; *) flow=$PWD/$JOBGEN_PAYLOAD_DIR ;; esac
flow=$flow/common/job_flow.sh
# shellcheck disable=SC1090
source "$flow" || { printf 'jobgen: cannot read %s: the payload snapshot this job was rendered with is missing (render or submit it again with jobgen, which places it)\n' "$flow" >&2; exit 78; }
flow_slurm_job "${#COMPILE_ARGS[@]}" ${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"} ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
}
JOBGEN_SCRIPT_<hash>
)
job_2=$(sbatch --parsable "--dependency=afterok:${job_1%%;*}" --kill-on-invalid-dep=yes <<'JOBGEN_SCRIPT_<hash>'
#!/bin/bash
#SBATCH --job-name=pythia6.9b-train
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=128
#SBATCH --exclusive
#SBATCH --partition=compute1
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#
# "pythia6.9b: Pythia 6.9B (32 layers, hidden 4096), TP 8, GPT-2 BPE, Neuron NeMo"
# Rendered by jobgen from "recipes/pythia6.9b.yaml" for site "trn1-pcluster"; re-render instead of editing.
# Two passes on the same nodes with the same settings: a 3-step compile pass that fills the
# compile cache, then the training pass, which resumes from the newest checkpoint in RUN_DIR.
set -uo pipefail
# Everything below is one { ... } block, which bash reads whole before running any of it: a
# script cut short (a render that died half-way into `| sbatch`) is a syntax error, not half a job.
{

# ---- values from the job spec (every one quoted by jobgen) -----------------------------------
# The node contract (jobgen/payloads/node.py says what each variable means), then the recipe's and the
# platform's environment, then the two passes' trainer arguments.
export MASTER_PORT=41000
export JOBGEN_RUN_DIR=/fsx/jobgen/runs/pythia6.9b-4n
export JOBGEN_PAYLOAD_DIR=/fsx/jobgen/payload/<payload>
export JOBGEN_PAYLOAD_DIGEST=<payload-digest>
export JOBGEN_LAUNCHER=neuron_nemo/launch.sh
export JOBGEN_WORKERS_PER_NODE=32
export JOBGEN_WORKDIR=/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling
export JOBGEN_PROGRAM=megatron_gpt_pretraining.py
export JOBGEN_COMPILE_WRAPPER=neuron_parallel_compile
export JOBGEN_COMPILE_STEPS=3
export JOBGEN_PASSES=train
export JOBGEN_COMPILE_MODE=auto
export JOBGEN_COMPILE_CACHE=/fsx/neuron-compile-cache
export JOBGEN_LOCAL_COMPILE_CACHE=/local_storage/neuron-compile-cache
export JOBGEN_COMPILE_KEY=pythia6.9b-4n-754d15d3db081921
export JOBGEN_CACHE_VAR=NEURON_COMPILE_CACHE_URL
export JOBGEN_NODES=4
export JOBGEN_MAX_RESTARTS=10
export JOBGEN_COLLECTIVE_TIMEOUT=1800
export JOBGEN_SHARED_FS=1
export JOBGEN_MASTER_RESOLVER=nslookup
export JOBGEN_LUSTRE_MAX_DIRTY_MB=64
export JOBGEN_ACTIVATE=/home/ubuntu/aws_neuron_venv_pytorch/bin/activate
export JOBGEN_HEALTH='{"clock_max_offset_ms":100.0,"devices":{"command":["neuron-ls"],"count":16,"files":"/dev/neuron*"},"efa_interfaces":8,"local_free_gib":50.0,"max_requeues":3,"shared_free_gib":76.62,"timeout_s":20}'
export JOBGEN_DATA='{"format":"megatron","global_batch":256,"key":"data.path","planned_samples":2560000,"prefixes":["/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document"],"recipe":"recipes/pythia6.9b.yaml","seq_length":2048,"train_share":0.98,"vocab_file":"/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json","vocab_padded":50304,"vocab_size":50257}'
export FI_PROVIDER=efa
export FI_EFA_USE_DEVICE_RDMA=1
export FI_EFA_FORK_SAFE=1
export NEURON_CC_FLAGS='--model-type transformer --distribution-strategy=llm-training --enable-mixed-precision-accumulation'
export NEURON_FUSE_SOFTMAX=1
export XLA_USE_BF16=1
export NEURON_RT_STOCHASTIC_ROUNDING_EN=1
export HYDRA_FULL_ERROR=1
export BUCKET_CAP_MB=1024
export MALLOC_ARENA_MAX=128
export NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=5
export NEURON_RT_EXEC_TIMEOUT=10
export NEURON_TRANSFER_WITH_STATIC_RING_OPS=''
export TF_NUM_INTEROP_THREADS=1024
export XLA_IO_THREAD_POOL_SIZE=4
export XLA_THREAD_POOL_SIZE=4
COMPILE_ARGS=(
  --config-name=megatron_neox_config
  trainer.devices=32
  trainer.num_nodes=4
  trainer.max_epochs=null
  trainer.max_steps=3
  trainer.val_check_interval=3
  trainer.log_every_n_steps=1
  trainer.limit_val_batches=1
  trainer.limit_test_batches=1
  trainer.accumulate_grad_batches=1
  trainer.gradient_clip_val=1.0
  trainer.precision=32
  model.megatron_amp_O2=False
  model.seed=1234
  model.make_vocab_size_divisible_by=8
  model.micro_batch_size=2
  model.global_batch_size=256
  model.tensor_model_parallel_size=8
  model.pipeline_model_parallel_size=1
  model.sequence_parallel=True
  model.wrap_with_zero=False
  model.max_position_embeddings=2048
  model.encoder_seq_length=2048
  model.hidden_size=4096
  model.ffn_hidden_size=16384
  model.num_layers=32
  model.num_attention_heads=32
  model.init_method_std=0.021
  model.use_scaled_init_method=True
  model.hidden_dropout=0.0
  model.attention_dropout=0.0
  model.layernorm_epsilon=1e-05
  model.position_embedding_type=rope
  model.rotary_percentage=0.25
  model.transformer_block_type=gpt_j
  model.use_cpu_initialization=True
  model.tokenizer.vocab_file=/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json
  model.tokenizer.merge_file=/home/ubuntu/examples_datasets/gpt2/gpt2-merges.txt
  'model.data.data_prefix=[1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document]'
  model.data.num_workers=1
  model.data.seq_length=2048
  'model.data.splits_string="980,10,10"'
  model.optim.name=adamw
  model.optim.capturable=True
  model.optim.lr=0.00012
  'model.optim.betas=[0.9,0.95]'
  +model.optim.eps=1e-08
  model.optim.weight_decay=0.01
  model.optim.sched.name=CosineAnnealing
  model.optim.sched.warmup_steps=100
  model.optim.sched.constant_steps=0
  model.optim.sched.min_lr=1.2e-05
  +model.optim.sched.max_steps=10000
  +model.save_xser=True
  +model.load_xser=True
  exp_manager.explicit_log_dir=/fsx/jobgen/runs/pythia6.9b-4n/compile
  exp_manager.create_tensorboard_logger=False
  exp_manager.resume_if_exists=False
  exp_manager.resume_ignore_no_checkpoint=True
  exp_manager.create_checkpoint_callback=False
  +exp_manager.checkpoint_callback_params.dirpath=/fsx/jobgen/runs/pythia6.9b-4n/compile/checkpoints
  exp_manager.checkpoint_callback_params.monitor=step
  exp_manager.checkpoint_callback_params.mode=max
  exp_manager.checkpoint_callback_params.save_last=False
  exp_manager.checkpoint_callback_params.save_top_k=3
  async_checkpointing=False
  model.activations_checkpoint_granularity=full
  model.activations_checkpoint_method=uniform
  model.activations_checkpoint_num_layers=1
  +exp_manager.checkpoint_callback_params.every_n_train_steps=500
)
TRAIN_ARGS=(
  --config-name=megatron_neox_config
  trainer.devices=32
  trainer.num_nodes=4
  trainer.max_epochs=null
  trainer.max_steps=10000
  trainer.val_check_interval=10000
  trainer.log_every_n_steps=1
  trainer.limit_val_batches=1
  trainer.limit_test_batches=1
  trainer.accumulate_grad_batches=1
  trainer.gradient_clip_val=1.0
  trainer.precision=32
  model.megatron_amp_O2=False
  model.seed=1234
  model.make_vocab_size_divisible_by=8
  model.micro_batch_size=2
  model.global_batch_size=256
  model.tensor_model_parallel_size=8
  model.pipeline_model_parallel_size=1
  model.sequence_parallel=True
  model.wrap_with_zero=False
  model.max_position_embeddings=2048
  model.encoder_seq_length=2048
  model.hidden_size=4096
  model.ffn_hidden_size=16384
  model.num_layers=32
  model.num_attention_heads=32
  model.init_method_std=0.021
  model.use_scaled_init_method=True
  model.hidden_dropout=0.0
  model.attention_dropout=0.0
  model.layernorm_epsilon=1e-05
  model.position_embedding_type=rope
  model.rotary_percentage=0.25
  model.transformer_block_type=gpt_j
  model.use_cpu_initialization=True
  model.tokenizer.vocab_file=/home/ubuntu/examples_datasets/gpt2/gpt2-vocab.json
  model.tokenizer.merge_file=/home/ubuntu/examples_datasets/gpt2/gpt2-merges.txt
  'model.data.data_prefix=[1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document]'
  model.data.num_workers=1
  model.data.seq_length=2048
  'model.data.splits_string="980,10,10"'
  model.optim.name=adamw
  model.optim.capturable=True
  model.optim.lr=0.00012
  'model.optim.betas=[0.9,0.95]'
  +model.optim.eps=1e-08
  model.optim.weight_decay=0.01
  model.optim.sched.name=CosineAnnealing
  model.optim.sched.warmup_steps=100
  model.optim.sched.constant_steps=0
  model.optim.sched.min_lr=1.2e-05
  +model.optim.sched.max_steps=10000
  +model.save_xser=True
  +model.load_xser=True
  exp_manager.explicit_log_dir=/fsx/jobgen/runs/pythia6.9b-4n/nemo
  exp_manager.create_tensorboard_logger=True
  exp_manager.resume_if_exists=True
  exp_manager.resume_ignore_no_checkpoint=True
  exp_manager.create_checkpoint_callback=True
  +exp_manager.checkpoint_callback_params.dirpath=/fsx/jobgen/runs/pythia6.9b-4n/nemo/checkpoints
  exp_manager.checkpoint_callback_params.monitor=step
  exp_manager.checkpoint_callback_params.mode=max
  exp_manager.checkpoint_callback_params.save_last=False
  exp_manager.checkpoint_callback_params.save_top_k=3
  async_checkpointing=False
  model.activations_checkpoint_granularity=full
  model.activations_checkpoint_method=uniform
  model.activations_checkpoint_num_layers=1
  +exp_manager.checkpoint_callback_params.every_n_train_steps=500
)
# ---- end of generated values ----------------------------------------------------------------

# Relative paths are taken from the submission directory. The two-pass flow (compile marker,
# compile pass, node-local cache copy, training pass, status, requeue) is payload/common/
# job_flow.sh, the same for every executor; this script only hands it Slurm's facts.
cd "${SLURM_SUBMIT_DIR:-.}" || exit 1
case $JOBGEN_PAYLOAD_DIR in /*) flow=$JOBGEN_PAYLOAD_DIR ;; *) flow=$PWD/$JOBGEN_PAYLOAD_DIR ;; esac
flow=$flow/common/job_flow.sh
# shellcheck disable=SC1090
source "$flow" || { printf 'jobgen: cannot read %s: the payload snapshot this job was rendered with is missing (render or submit it again with jobgen, which places it)\n' "$flow" >&2; exit 78; }
flow_slurm_job "${#COMPILE_ARGS[@]}" ${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"} ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
}
JOBGEN_SCRIPT_<hash>
)
echo "${job_1%%;*} ${job_2%%;*}"

"""Typed GRPO and SFT settings: every knob once, with its help text, per profile (cpu | cpu-smollm2 | gpu)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from conductor_pipeline.training.reward import RewardVariant

# The paper trains a 7B conductor (1.5B fits one 24-48 GB GPU with colocated vLLM).
PAPER_POLICY = "Qwen/Qwen2.5-7B-Instruct"


# --- settings ----------------------------------------------------------------------------------


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _knob(text: str, **bounds: float) -> dict[str, Any]:
    """Metadata of a knob a configuration may override (the trainer resource exposes it under the
    same name and help text), with the bounds a configured value must keep (pydantic's ge/gt)."""
    return {"help": text, "override": bounds}


TINY_POLICY = "tiny"  # the offline model from conductor_pipeline.training.tiny_models (CPU profile)
# The pretrained instruct model of the cpu-smollm2 profile (conductor_pipeline.training.pretrained).
SMOLLM2_POLICY = "smollm2-135m-instruct"
# The tiny CPU policy's shape: on a CPU a step costs about as much as a narrower model's (both are
# overhead-bound) and the format is learnt in fewer steps; deeper or wider models learnt it slower.
CPU_POLICY_HIDDEN_SIZE = 128
CPU_POLICY_LAYERS = 2
# The cpu profiles' GRPO learning rate: the fastest learner of a measured sweep (docs/LOG.md).
CPU_LEARNING_RATE = 1e-3
# The gpu profile trains low-rank adapters instead of every weight for policies of this many
# billion parameters or more (read from the model id, e.g. "Qwen2.5-7B-Instruct"): a full 7B
# fine-tune holds bf16 weights, gradients and two AdamW states (8 bytes a parameter, about 61 GB)
# before activations, which next to colocated vLLM's 30% share does not fit an 80 GB card; the
# adapters (about 81M parameters at rank 32) cost about 1.3 GB with their optimizer states. A
# 1.5B policy (about 12 GB fully fine-tuned) keeps full fine-tuning unless a rank is set.
GPU_LORA_MIN_BILLIONS = 7.0
GPU_LORA_RANK = 32
GPU_LORA_ALPHA = 64
# A size in a model id: "7B", "1.5B", "405B" (not "135M", which is under a billion anyway).
_SIZE_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


@dataclass(frozen=True)
class LoraSettings:
    """Low-rank adapters (peft) instead of full fine-tuning; rank 0 (the default) trains every weight."""

    rank: int = field(default=0, metadata=_knob(
        f"LoRA rank; 0 trains every weight (full fine-tuning). Empty: the profile's (gpu: rank {GPU_LORA_RANK} "
        f"for policies of {GPU_LORA_MIN_BILLIONS:g}B parameters or more by their model id, else 0). The warm "
        "start merges its adapters into a plain model folder; GRPO checkpoints hold adapters over the model "
        "GRPO started from.", ge=0))
    alpha: int = field(default=32, metadata=_knob("LoRA scaling alpha (the update is scaled by alpha / rank).", ge=1))
    dropout: float = field(default=0.0, metadata=_help("Dropout on the adapters' input."))
    target_modules: str = field(default="all-linear", metadata=_knob(
        "Modules that get adapters: 'all-linear' (every linear layer but the output head) or a comma-separated list."))

    def to_peft_config(self):
        """A `peft.LoraConfig`, or None for full fine-tuning."""
        if self.rank <= 0:
            return None
        try:
            from peft import LoraConfig
        except ImportError as exc:
            raise ImportError(f"LoRA (rank {self.rank}) needs the `peft` package: pip install peft") from exc
        targets = self.target_modules if self.target_modules == "all-linear" else [
            name.strip() for name in self.target_modules.split(",") if name.strip()
        ]
        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets, task_type="CAUSAL_LM"
        )


def parameter_billions(model: str) -> float | None:
    """The parameter count a model id states, in billions ("Qwen/Qwen2.5-7B-Instruct" -> 7.0);
    None when its last path component names no size."""
    found = _SIZE_IN_NAME.findall(str(model).rstrip("/").rsplit("/", 1)[-1])
    return float(found[-1]) if found else None


def gpu_lora(model: str) -> LoraSettings:
    """The gpu profile's adapters for `model`: rank GPU_LORA_RANK for 7B-class policies (by the size
    in the model id), full fine-tuning otherwise (a local path without a size: set a rank)."""
    size = parameter_billions(model)
    if size is not None and size >= GPU_LORA_MIN_BILLIONS:
        return LoraSettings(rank=GPU_LORA_RANK, alpha=GPU_LORA_ALPHA)
    return LoraSettings()


@dataclass(frozen=True)
class GRPOSettings:
    """Every GRPO knob of the conductor run; the defaults are the Conductor paper's."""

    policy_model: str = field(default=PAPER_POLICY, metadata=_help(
        "Policy to train: a hub id / local path, or 'tiny' for the offline CPU model."))
    num_generations: int = field(default=64, metadata=_knob(
        "Group size: rollouts sampled per question (paper 64). Small groups are more often all-equal.", ge=2))
    questions_per_step: int = field(default=4, metadata=_knob(
        "Distinct questions per optimizer step (paper 4); a step sees questions_per_step x num_generations rollouts.",
        ge=1))
    max_steps: int = field(default=200, metadata=_knob("Optimizer steps, the paper's 'iterations' (200).", ge=1))
    learning_rate: float = field(default=1e-6, metadata=_knob("AdamW learning rate (paper 1e-6).", gt=0))
    temperature: float = field(default=1.0, metadata=_help("Rollout sampling temperature (paper 1.0)."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling for rollouts; 1.0 = plain temperature sampling."))
    max_completion_length: int = field(default=1024, metadata=_knob(
        "Token cap on a sampled workflow (reasoning + lists); truncated rollouts usually fail to parse.", ge=8))
    beta: float = field(default=0.0, metadata=_help("KL coefficient to the reference policy (paper: no KL, 0.0)."))
    loss_type: str = field(default="grpo", metadata=_knob(
        "TRL loss aggregation: 'grpo' (per-sequence mean, the paper's GRPO) or 'dapo'/'dr_grpo'/... (TRL default dapo)."))
    scale_rewards: str = field(default="group", metadata=_knob(
        "Advantage scaling: 'group' (standard GRPO), 'batch', or 'none' (Dr. GRPO: a group whose rewards differ "
        "only by a small price keeps small advantages)."))
    num_iterations: int = field(default=1, metadata=_help("Policy updates per generation batch (GRPO's mu)."))
    save_steps: int = field(default=10, metadata=_knob(
        "Checkpoint every N steps (10: a killed run loses at most 10 steps); a rerun resumes from the latest.", ge=1))
    save_total_limit: int | None = field(default=None, metadata=_help("Keep at most this many checkpoints; None keeps all."))
    reward_variant: RewardVariant = field(default="paper", metadata=_knob(
        "'paper': 0 unparseable / 0.5 parsed but wrong / 1 correct; 'strict': 0 / 0 / 1."))
    cost_weight: float = field(default=0.0, metadata=_knob(
        "Reward penalty per USD of worker cost; 0 keeps cost out of the reward (the paper).", ge=0))
    world_model_bonus_weight: float = field(default=0.0, metadata=_knob(
        "Reward bonus weight * max(0, correct - W's P(success) of the final worker); 0 (off) by default. "
        "The last and most careful use of W (see `routing_bonus`); needs the pool's world model.", ge=0))
    randomize_pools: bool = field(default=True, metadata=_knob(
        "Show each training question a random subset of the pool (the paper's randomised pools)."))
    min_pool_size: int = field(default=2, metadata=_knob(
        "Smallest random pool subset shown to the policy (sizes are drawn uniformly from it to max_pool_size).", ge=1))
    max_pool_size: int | None = field(default=None, metadata=_knob(
        "Largest random pool subset shown to the policy; None: the whole pool (a zoo of many seats needs a cap).",
        ge=1))
    per_device_train_batch_size: int = field(default=8, metadata=_help(
        "Rollouts per forward/backward micro-batch; gradient accumulation makes up a full step."))
    num_processes: int = field(default=1, metadata=_help(
        "Training processes (GPUs) under accelerate; used to derive gradient accumulation."))
    gradient_checkpointing: bool = field(default=True, metadata=_help("Trade compute for memory (large models)."))
    bf16: bool = field(default=True, metadata=_help("bfloat16 mixed precision (GPU); off on CPU."))
    use_vllm: bool = field(default=False, metadata=_help("Generate rollouts with vLLM instead of transformers."))
    vllm_mode: Literal["colocate", "server"] = field(default="colocate", metadata=_knob(
        "'colocate': vLLM shares the training GPU; 'server': a separate `trl vllm-serve` process."))
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=_help(
        "Colocate mode: GPU memory share vLLM may take; the rest trains the policy."))
    vllm_server_base_url: str | None = field(default=None, metadata=_knob(
        "Server mode: base URL of `trl vllm-serve` (e.g. http://127.0.0.1:8000)."))
    use_cpu: bool = field(default=False, metadata=_help("Train on CPU even when a GPU is visible (CPU profile)."))
    share_prompt_prefix: bool = field(default=False, metadata=_help(
        "Run each group's prompt through the policy once, when sampling and in the loss, instead of once per "
        "rollout (conductor_pipeline.training.trl_extensions): same loss and gradients. Transformers rollouts "
        "only (not vLLM) and no gradient checkpointing; shares fully when a step is one micro-batch."))
    constrained_decoding: bool = field(default=False, metadata=_knob(
        "Sample only workflows that parse against the workers each prompt shows (conductor.constrained): no "
        "unparseable rollout, no unknown worker. The loss scores them under the unconstrained policy. On the "
        "transformers path it needs share_prompt_prefix; with vLLM it is a structured-outputs regex over the "
        "names of every prompt, which holds the format but not each prompt's own catalogue."))
    fan_outs_only: bool = field(default=False, metadata=_knob(
        "With constrained_decoding, on prompts that show a vote seat and three or more other workers: every "
        "sampled workflow of more than one step is a fan-out the vote closes (conductor.constrained), so calling a "
        "second worker is the same choice as voting; the warm start's fan_out_warm_start targets have these "
        "shapes. The transformers sampler only (vLLM's regex does not hold it)."))
    report_to: str = field(default="tensorboard", metadata=_help(
        "Experiment trackers TRL reports every step to (transformers' report_to): 'tensorboard' writes event "
        "files under the run's folder as it trains (`make tensorboard` shows them live); 'none' turns it off."))
    seed: int = field(default=0, metadata=_help("Seed for sampling, data order and pool randomisation."))
    lora: LoraSettings = field(default_factory=LoraSettings, metadata=_help(
        "Low-rank adapters instead of full fine-tuning (rank 0: full fine-tuning)."))

    def __post_init__(self) -> None:
        """The rules between GRPO's own knobs, checked whenever settings are made (a profile, an override)."""
        if self.max_pool_size is not None and self.max_pool_size < self.min_pool_size:
            raise ValueError(f"max_pool_size {self.max_pool_size} is below min_pool_size {self.min_pool_size}")
        if self.fan_outs_only and not self.constrained_decoding:
            raise ValueError("fan_outs_only is a rule of constrained decoding: set constrained_decoding: true too")
        if self.fan_outs_only and not self.share_prompt_prefix:
            raise ValueError("fan_outs_only is a rule of the shared-prompt sampler's grammar (share_prompt_prefix); "
                             "vLLM's structured-outputs regex does not hold it")
        if self.constrained_decoding and not (self.share_prompt_prefix or self.use_vllm):
            raise ValueError(
                "constrained_decoding needs share_prompt_prefix (the CPU sampler) or use_vllm (structured outputs)"
            )

    @property
    def rollouts_per_step(self) -> int:
        return self.questions_per_step * self.num_generations

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per step, so one optimizer step consumes exactly one generation batch."""
        per_pass = self.per_device_train_batch_size * self.num_processes
        if self.rollouts_per_step % per_pass:
            raise ValueError(
                f"questions_per_step x num_generations ({self.rollouts_per_step}) must be divisible by "
                f"per_device_train_batch_size x num_processes ({per_pass})"
            )
        return self.rollouts_per_step // per_pass

    @classmethod
    def cpu_profile(cls, **overrides: Any) -> GRPOSettings:
        """The embedded default and CI: the tiny offline model, groups of 8, a few dozen steps.

        lr is far above the paper's: a tiny model moves nowhere at 1e-6; of 1e-4, 3e-4 and 1e-3 (the
        learnability ladder's R2, docs/LOG.md) 1e-3 learnt which workers to prefer fastest, within
        about 100 steps of 16 rollouts, so the default run trains 120. Groups of 8: groups of 4 are
        too often all-equal for the zero-variance gate. The 80-token cap holds every compact
        warm-start target (a test checks), so no sampled workflow of a learnt shape is cut.
        """
        settings = cls(
            policy_model=TINY_POLICY,
            num_generations=8,
            questions_per_step=2,
            max_steps=120,
            learning_rate=CPU_LEARNING_RATE,
            max_completion_length=80,
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            use_vllm=False,
            randomize_pools=True,
            share_prompt_prefix=True,
        )
        settings = replace(settings, **overrides)
        if "per_device_train_batch_size" not in overrides:  # one micro-batch a step: every prompt shared fully
            settings = replace(settings, per_device_train_batch_size=settings.rollouts_per_step // settings.num_processes)
        return settings

    @classmethod
    def cpu_paper_profile(cls, **overrides: Any) -> GRPOSettings:
        """The paper's rollout budget on the tiny CPU policy: groups of 64, 4 questions a step, 200
        steps (51,200 rollouts) at temperature 1.0, checkpoints every 10 steps; one micro-batch a
        step, so each group's prompt is computed once. The learning rate is the cpu profile's
        (`CPU_LEARNING_RATE`; how it was chosen: docs/LOG.md)."""
        paper = dict(num_generations=64, questions_per_step=4, max_steps=200, learning_rate=CPU_LEARNING_RATE,
                     save_steps=10)
        return cls.cpu_profile(**{**paper, **overrides})

    @classmethod
    def cpu_smollm2_profile(cls, **overrides: Any) -> GRPOSettings:
        """A real pretrained instruct model on CPU (SmolLM2-135M-Instruct): the GPU profile's prompt,
        chat template and warm-start style at CPU sizes (a step is minutes, not seconds).

        Groups of 4 x 2 questions keep a step to eight rollouts; the 128-token cap holds every
        paper-style warm-start target in this tokenizer (a test checks); lr 1e-5 moves a 135M model in
        a few dozen steps where the paper's 1e-6 (for 7B, 200 steps) would not.
        """
        settings = cls.cpu_profile(
            policy_model=SMOLLM2_POLICY,
            num_generations=4,
            questions_per_step=2,
            max_steps=10,
            learning_rate=1e-5,
            max_completion_length=128,
            per_device_train_batch_size=4,
        )
        return replace(settings, **overrides)

    @classmethod
    def gpu_profile(
        cls,
        model: str = PAPER_POLICY,
        *,
        vllm_mode: Literal["colocate", "server"] = "colocate",
        **overrides: Any,
    ) -> GRPOSettings:
        """The paper's run: Qwen2.5 policy, vLLM rollouts, bf16, every paper default kept; LoRA
        adapters for 7B-class policies (`gpu_lora`)."""
        settings = cls(
            policy_model=model,
            lora=gpu_lora(model),
            use_vllm=True,
            vllm_mode=vllm_mode,
            bf16=True,
            gradient_checkpointing=True,
            per_device_train_batch_size=8,
            vllm_server_base_url="http://127.0.0.1:8000" if vllm_mode == "server" else None,
        )
        return replace(settings, **overrides)

    def to_grpo_config(self, output_dir: str | Path, **overrides: Any):
        """A real `trl.GRPOConfig`: one optimizer step per generation batch, log every step.

        transformers validates bf16 against the hardware, so the GPU profile's config can only be
        built where a bf16 GPU is present; `grpo_config_kwargs` is the hardware-free part.
        """
        from trl import GRPOConfig

        return GRPOConfig(**self.grpo_config_kwargs(output_dir, **overrides))

    def grpo_config_kwargs(self, output_dir: str | Path, **overrides: Any) -> dict[str, Any]:
        """The keyword arguments `to_grpo_config` passes to `trl.GRPOConfig`."""
        kwargs: dict[str, Any] = dict(
            output_dir=str(output_dir),
            num_generations=self.num_generations,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_steps=self.max_steps,
            learning_rate=self.learning_rate,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,
            max_completion_length=self.max_completion_length,
            beta=self.beta,
            loss_type=self.loss_type,
            scale_rewards=self.scale_rewards,
            num_iterations=self.num_iterations,
            save_strategy="steps",
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            logging_steps=1,
            seed=self.seed,
            data_seed=self.seed,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            use_cpu=self.use_cpu,
            use_vllm=self.use_vllm,
            vllm_mode=self.vllm_mode,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            vllm_server_base_url=self.vllm_server_base_url,
            remove_unused_columns=False,  # the reward needs question_id / workers columns
            report_to=self.report_to,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        if self.bf16:
            kwargs["model_init_kwargs"] = {"dtype": "bfloat16"}
        kwargs.update(overrides)
        return kwargs

    def peft_config(self):
        """The LoRA config GRPO wraps the policy in; None for full fine-tuning."""
        return self.lora.to_peft_config()

    def describe(self) -> dict[str, Any]:
        """Flat knob -> value mapping for asset metadata."""
        return asdict(self)


@dataclass(frozen=True)
class SFTSettings:
    """Supervised warm start: teach the policy the workflow format before GRPO."""

    learning_rate: float = field(default=1e-5, metadata=_knob("AdamW learning rate.", gt=0))
    max_steps: int = field(default=200, metadata=_knob("Optimizer steps (-1: use num_train_epochs).", ge=1))
    num_train_epochs: float = field(default=1.0, metadata=_help("Epochs when max_steps is -1."))
    per_device_train_batch_size: int = field(default=8, metadata=_help("Examples per micro-batch."))
    gradient_accumulation_steps: int = field(default=1, metadata=_help("Micro-batches per optimizer step."))
    max_length: int | None = field(default=2048, metadata=_help("Token cap on prompt + completion."))
    completion_only_loss: bool = field(default=True, metadata=_help(
        "Train on the workflow text only, not on the prompt (the catalogue and question)."))
    group_by_length: bool = field(default=True, metadata=_help(
        "Batch examples of similar length (transformers' LengthGroupedSampler): a catalogue's length varies "
        "with its sub-pool, and a random batch pads every prompt to its longest."))
    warmup_steps: float = field(default=0.0, metadata=_help(
        "Linear warmup: an int is steps, a float in [0, 1) a share of all steps (transformers 5)."))
    bf16: bool = field(default=True, metadata=_help("bfloat16 mixed precision (GPU); off on CPU."))
    gradient_checkpointing: bool = field(default=True, metadata=_help("Trade compute for memory (large models)."))
    use_cpu: bool = field(default=False, metadata=_help("Train on CPU even when a GPU is visible (CPU profile)."))
    seed: int = field(default=0, metadata=_help("Seed for data order and initialisation."))
    lora: LoraSettings = field(default_factory=LoraSettings, metadata=_help(
        "Low-rank adapters instead of full fine-tuning (rank 0: full fine-tuning); merged into the saved model."))

    @classmethod
    def cpu_profile(cls, **overrides: Any) -> SFTSettings:
        """Tiny model, high lr, short run: enough for the format to appear in samples.

        The last tenths of loss are what make sampled structure reliable: lr 7e-3 with 10% warmup
        over 160 steps gets there; higher rates are unstable on some seeds.
        """
        settings = cls(
            learning_rate=7e-3,
            max_steps=160,
            per_device_train_batch_size=8,
            max_length=1024,
            warmup_steps=0.1,
            bf16=False,
            use_cpu=True,
            gradient_checkpointing=False,
        )
        return replace(settings, **overrides)

    @classmethod
    def cpu_smollm2_profile(cls, **overrides: Any) -> SFTSettings:
        """SmolLM2-135M-Instruct on CPU: a pretrained instruct model picks up the lists format in a
        few dozen steps at a rate far below the tiny model's; batches of 4 keep a step of ~650-token
        prompts to about a minute on two cores."""
        settings = cls.cpu_profile(learning_rate=1e-4, max_steps=40, per_device_train_batch_size=4, warmup_steps=0.1)
        return replace(settings, **overrides)

    @classmethod
    def gpu_profile(cls, model: str = PAPER_POLICY, **overrides: Any) -> SFTSettings:
        """bf16 with gradient checkpointing; LoRA adapters for 7B-class policies (`gpu_lora`)."""
        settings = cls(learning_rate=1e-5, max_steps=100, bf16=True, gradient_checkpointing=True, lora=gpu_lora(model))
        return replace(settings, **overrides)

    def to_sft_config(self, output_dir: str | Path, **overrides: Any):
        from trl import SFTConfig

        kwargs: dict[str, Any] = dict(
            output_dir=str(output_dir),
            learning_rate=self.learning_rate,
            max_steps=self.max_steps,
            num_train_epochs=self.num_train_epochs,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_length=self.max_length,
            completion_only_loss=self.completion_only_loss,
            train_sampling_strategy="group_by_length" if self.group_by_length else "random",
            warmup_steps=self.warmup_steps,
            lr_scheduler_type="cosine",
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            use_cpu=self.use_cpu,
            seed=self.seed,
            data_seed=self.seed,
            logging_steps=1,
            save_strategy="no",  # a warm start is cheap to redo; the final model is saved explicitly
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        kwargs.update(overrides)
        return SFTConfig(**kwargs)

    def peft_config(self):
        """The LoRA config the warm start wraps the policy in; None for full fine-tuning."""
        return self.lora.to_peft_config()


def overridable_knobs(settings_class: type) -> dict[str, dict[str, float]]:
    """Field name -> bounds of the knobs a configuration may override (declared with `_knob`)."""
    return {f.name: dict(f.metadata["override"]) for f in fields(settings_class) if "override" in f.metadata}


def settings_help(settings_class: type) -> dict[str, str]:
    """Field name -> help text: the one source of every knob's description (the trainer resource's
    config fields read it, `resources.knobs`)."""
    return {f.name: f.metadata.get("help", "") for f in fields(settings_class)}

"""asp_ascend: Adaptive Scheduling Pipeline for RL post-training of LLMs.

The scheduler, simulator, data, lengths, metrics and config layers import only
numpy/pandas-level packages; torch, ray and vllm are imported lazily by the
runtime layers (pipeline/, engines/, algos/, platforms/, integrations/).
"""

__version__ = "0.1.0"

"""The models: configs and loading (HF directories, GGUF files), the Transformer and its CPU step (native, packed, int8, compiled), EAGLE-3 heads, KV caches, and the models cache of real models."""

"""The decoding loop: a request's generation, the scheduler, proposing and acceptance of token trees, speculation policies and budgets, the prompt cache and prefetching."""

"""The splits of the GPUs between vLLM and the trainers (:mod:`.split`, hosts with different GPU counts
included), the batch every split is compared at (:mod:`.batch_target`), what the recipe asks of vLLM and the
splits it allows (:mod:`.allowed`), and the refusals when it allows none (:mod:`.refusals`). Pure."""

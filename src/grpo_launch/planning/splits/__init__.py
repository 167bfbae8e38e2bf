"""The splits of the GPUs between vLLM and the trainers (:mod:`.split`, :mod:`.uneven`), the batch every split is
compared at (:mod:`.batch_target`), what the recipe asks of vLLM (:mod:`.requested`), the splits it allows
(:mod:`.allowed`) and the refusals when it allows none (:mod:`.refusals`). Pure."""

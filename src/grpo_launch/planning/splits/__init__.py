"""The splits of the GPUs between vLLM and the trainers (:mod:`.split`, hosts with different GPU counts
included), the batch each split is planned at (:mod:`.batch_target`: the batch rule), what the recipe asks of
vLLM and the splits it allows (:mod:`.allowed`), and the refusals when it allows none (:mod:`.refusals`). Pure."""

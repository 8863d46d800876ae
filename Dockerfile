FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tasks tasks
COPY web web
COPY worker worker
RUN pip install --no-cache-dir .

# One image for the web server and the CPU workers (they differ only in their command), and a
# `gpu` target for GPU workers that adds what the verl backend needs (vLLM).
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DJANGO_SETTINGS_MODULE=webapp.settings
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl bubblewrap && rm -rf /var/lib/apt/lists/*
COPY requirements.txt .
# The CPU build of torch (PyPI's default is the CUDA one, several GB the web server and the CPU
# workers never use); the gpu target below replaces it with the CUDA build vLLM pins.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -r requirements.txt
COPY . .
RUN SECRET_KEY=build-only DEBUG=0 python manage.py collectstatic --noinput
# The platform never runs as root (webapp/privileges.py): its own user owns /data, where run
# folders, the secret key and uploads live.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin agenttrainer \
    && mkdir -p /data && chown agenttrainer:agenttrainer /data
USER agenttrainer
EXPOSE 8000
CMD ["python", "-m", "webapp.server", "--host", "0.0.0.0", "--port", "8000"]

# GPU workers: verl's vLLM extra brings the vLLM build (and the torch it pins) that verl's
# rollouts run on. Ray comes with verl; see docs/verl.md to join a Ray cluster.
FROM base AS gpu
USER root
RUN pip install "verl[vllm]==0.9.1"
USER agenttrainer

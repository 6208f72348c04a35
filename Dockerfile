# The project image every pipeline component runs in (components are built with
# install_kfp_package=False: kfp and the project come from this image).
#   CPU:  docker build -t gem:latest .
#   GPU:  docker build -t gem:gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#                     --build-arg FBGEMM=fbgemm-gpu .
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG FBGEMM=fbgemm-gpu-cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

RUN apt-get update && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/gem

# torch (with its CUDA runtime wheels on a GPU index) first, then the fully pinned
# lock without dependency resolution, as `make install` does.
COPY requirements.lock ./
RUN pip install "torch==2.13.0" --index-url "${TORCH_INDEX}" \
    && grep -v '^torch==' requirements.lock | sed "s/^fbgemm_gpu-cpu==/${FBGEMM}==/" > /tmp/requirements.txt \
    && pip install --no-deps -r /tmp/requirements.txt

COPY pyproject.toml README.md ./
COPY kernels ./kernels
COPY gem ./gem
COPY students ./students
COPY gem_app ./gem_app
COPY benchmarks ./benchmarks
COPY feature_repo ./feature_repo
# PYTHONDONTWRITEBYTECODE keeps tasks from writing .pyc files, so the project's are
# compiled here once (every task's start-up imports them); torchrun is the TrainJob's
# node command (deploy/trainer/runtime.yaml)
RUN pip install --no-deps -e . && python -m compileall -q gem gem_app students kernels feature_repo \
    && torchrun --help > /dev/null

ENTRYPOINT ["python", "-m", "gem"]

# The percolator image: the library, the timestamp oracle, the observers worker
# and the loader, with every optional backend (.[all]).
#
#   docker build -t percolator .
#   docker run --rm percolator                      # a worker (see docker-compose.yml)
#   docker run --rm percolator python -m oracle --help
#
# docker-compose.yml builds it once and runs it as the oracle replicas, the worker
# and the one-shot "configure" service; docs/running-on-a-cluster.md walks through it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/percolator

# Metadata first, so that code changes do not reinstall the dependencies.
COPY setup.cfg pyproject.toml README.md ./
RUN mkdir -p percolator oracle observers spark_loader \
    && touch percolator/__init__.py oracle/__init__.py observers/__init__.py \
             spark_loader/__init__.py \
    && pip install '.[all]' \
    && pip uninstall -y percolator \
    && rm -rf percolator oracle observers spark_loader build

COPY percolator ./percolator
COPY oracle ./oracle
COPY observers ./observers
COPY spark_loader ./spark_loader
RUN pip install --no-deps . && rm -rf build

RUN useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin percolator
USER percolator

# The worker of the demo observers, on the cluster published in ZooKeeper.
CMD ["python", "-m", "observers", "--cluster", "zk://zookeeper:2181/percolator", \
     "--observers", "observers.demo:OBSERVERS", "--threads", "4"]

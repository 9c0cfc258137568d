# The Spark image of the compose file's `spark` profile: a Spark standalone master, its workers,
# and the driver that `make check MASTER=spark://spark-master:7077` runs `pinmq check` in.
#
# Spark comes from pinmq's own `check` extra (PySpark ships Spark's jars and spark-class), from
# the same wheelhouse as the node image (deploy/build-image.sh ... spark), so the driver, the
# master and the executors run one Spark and one Python. Java is Debian's headless JRE, from
# the base's apt sources over plain HTTP (no registry needed; deploy/build-image.sh).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
LABEL org.pinmq.image=true
COPY wheelhouse /wheels
RUN python3 -m venv /opt/pinmq \
 && /opt/pinmq/bin/pip install --no-index --no-cache-dir --find-links /wheels 'pinmq[check]' \
 && /opt/pinmq/bin/pip uninstall -y -q pip

FROM ${BASE}
LABEL org.pinmq.image=true
# The JRE's package scripts expect man directories that slim images leave out.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/pinmq --create-home pinmq
ENV PATH=/opt/pinmq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/pinmq/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/pinmq/bin/python \
    SPARK_NO_DAEMONIZE=1 \
    HOME=/tmp
USER pinmq
WORKDIR /tmp
# master (7077), its web UI (8080), a worker's web UI (8081)
EXPOSE 7077 8080 8081
ENTRYPOINT ["spark-class"]
CMD ["org.apache.spark.deploy.master.Master"]
COPY --from=build /opt/pinmq /opt/pinmq

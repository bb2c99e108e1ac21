"""Kafka SASL/TLS and Redis password/TLS from the environment; no secret in any log line."""

from __future__ import annotations

import asyncio
import signal
import ssl

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.config import ConfigError, KafkaSettings, RedisSettings
from test.harness.processes import CrawlerProcess
from test.harness.services import free_port, wait_for

SECRET = "s3cret-Do-Not-Log-7f3a"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"bootstrap_servers": "kafka:9092", "security_protocol": "PLAINTEXT"}),
        (
            {
                "KAFKA_HOSTS": "a:9092,b:9092",
                "KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
                "KAFKA_SASL_MECHANISM": "scram-sha-512",
                "KAFKA_SASL_USERNAME": "crawler",
                "KAFKA_SASL_PASSWORD": SECRET,
            },
            {
                "bootstrap_servers": "a:9092,b:9092",
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "crawler",
                "sasl_plain_password": SECRET,
            },
        ),
    ],
)
def test_kafka_client_options_from_the_environment(env, expected):
    assert KafkaSettings.from_env(env).client_options() == expected


def test_kafka_tls_builds_an_ssl_context():
    options = KafkaSettings.from_env(
        {
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_USERNAME": "u",
            "KAFKA_SASL_PASSWORD": "p",
        }
    ).client_options()
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["security_protocol"] == "SASL_SSL"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_USERNAME"),
        ({"KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "KAFKA_SSL_CAFILE",
        ),
        ({"REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "REDIS_TLS_CA_FILE"),
    ],
)
def test_bad_security_settings_name_their_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        KafkaSettings.from_env(env)
        RedisSettings.from_env(env)


def test_secrets_stay_out_of_reprs_and_error_messages():
    kafka = KafkaSettings.from_env(
        {
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_USERNAME": "u",
            "KAFKA_SASL_PASSWORD": SECRET,
        }
    )
    redis = RedisSettings.from_env(
        {"REDIS_URL": f"redis://:{SECRET}@host:6379/0", "REDIS_PASSWORD": SECRET}
    )
    assert SECRET not in repr(kafka) and SECRET not in repr(redis)
    assert redis.redacted_url == "redis://:***@host:6379/0"
    assert (
        RedisSettings.from_env({"REDIS_URL": f"redis://user:{SECRET}@h/1"}).redacted_url
        == "redis://user:***@h/1"
    )
    with pytest.raises(ConfigError) as raised:
        RedisSettings.from_env({"REDIS_URL": f"http://:{SECRET}@host"})
    assert SECRET not in str(raised.value)


async def test_processes_use_a_redis_password_and_never_log_a_secret(
    redis: Redis, redis_url, tmp_path
):
    """A worker and a monitor against a redis-server that requires a password, with SASL
    credentials for a broker that is not there: both run, and no log line holds a secret."""
    await redis.config_set("requirepass", SECRET)
    try:
        host_port = redis_url.removeprefix("redis://").removesuffix("/0")
        env = {
            "KAFKA_HOSTS": f"127.0.0.1:{free_port()}",
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_USERNAME": "crawler",
            "KAFKA_SASL_PASSWORD": SECRET,
            "REDIS_URL": f"redis://:{SECRET}@{host_port}/0",
            "THUMBNAIL_STORE": "local",
            "THUMBNAIL_DIR": str(tmp_path / "thumbnails"),
        }
        sources = tmp_path / "sources.json"
        sources.write_text('[{"source_name": "example", "image_count": 5000000}]')
        worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
        monitor = CrawlerProcess(
            "crawl_monitor", {**env, "SOURCES_FILE": str(sources)}, tmp_path / "monitor.log"
        )
        try:
            await asyncio.to_thread(worker.wait_for_event, "kafka_unavailable", 30)
            await asyncio.to_thread(monitor.wait_for_event, "kafka_unavailable", 30)
            # The monitor's regulator runs without Kafka: it reached Redis with the password.
            authed = Redis.from_url(f"redis://:{SECRET}@{host_port}/0", decode_responses=True)
            try:
                await wait_for(
                    lambda: authed.exists(c.pace_rate_key("example")), 10, what="a pacing rate"
                )
            finally:
                await authed.aclose()
            for process in (worker, monitor):
                process.signal(signal.SIGTERM)
                assert process.wait(30) == 0, process.tail()
                log = process.log_path.read_text()
                assert SECRET not in log, f"{process.module} logged a secret"
        finally:
            worker.stop()
            monitor.stop()
    finally:
        cleanup = Redis.from_url(f"redis://:{SECRET}@{redis_url.removeprefix('redis://')}")
        await cleanup.config_set("requirepass", "")
        await cleanup.aclose()

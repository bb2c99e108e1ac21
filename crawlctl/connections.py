"""Where a subcommand finds Kafka and Redis: the environment the crawler's processes read
(``KAFKA_HOSTS``, ``REDIS_URL`` or ``REDIS_HOST``/``REDIS_PORT``), or ``--kafka`` and
``--redis``.

A setting the configuration refuses is the operator's to fix: it becomes a ``UsageError``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import redis.asyncio as aioredis

from crawlctl.console import Parser, UsageError
from image_crawler.config import ConfigError, KafkaSettings, RedisSettings


def kafka_option() -> Parser:
    """The ``--kafka`` option, as a parent parser."""
    parent = Parser(add_help=False)
    parent.add_argument(
        "--kafka", metavar="HOSTS", help="bootstrap servers (default: KAFKA_HOSTS, kafka:9092)"
    )
    return parent


def redis_option() -> Parser:
    """The ``--redis`` option, as a parent parser."""
    parent = Parser(add_help=False)
    parent.add_argument(
        "--redis",
        metavar="URL",
        help="redis://host:port/db (default: REDIS_URL, else REDIS_HOST and REDIS_PORT)",
    )
    return parent


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The environment's Kafka settings (security included), ``--kafka`` overriding hosts."""
    try:
        settings = KafkaSettings.from_env(os.environ)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.kafka:
        settings = dataclasses.replace(settings, bootstrap_servers=str(args.kafka))
    return settings


def redis_settings(args: argparse.Namespace) -> RedisSettings:
    """The environment's Redis settings, ``--redis`` overriding them."""
    env = {**os.environ, "REDIS_URL": args.redis} if args.redis else os.environ
    try:
        return RedisSettings.from_env(env)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def redis_client(settings: RedisSettings) -> aioredis.Redis:
    """A client that decodes replies and gives up on an unreachable server within 5 s."""
    return settings.client(decode_responses=True, socket_connect_timeout=5.0, socket_timeout=5.0)

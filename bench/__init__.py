"""Benchmarks of gatewayd against mosquitto and amqtt: see bench/README.md."""

"""The network front: AMQP 1.0 connections over proton's engine, addresses, SASL and CBS."""

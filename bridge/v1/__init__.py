"""Generated protobuf/gRPC code for bridge.v1 (make proto). Do not edit."""

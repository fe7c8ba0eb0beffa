"""Authentication: Shared Access Signature tokens as Service Bus issues and checks them."""

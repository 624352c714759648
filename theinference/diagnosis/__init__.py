"""Which known bug a failing stage has, and where: from its numbers or its errors."""

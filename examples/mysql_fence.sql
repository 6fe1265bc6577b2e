-- SPDX-License-Identifier: BSD-3-Clause
-- The resource side on MariaDB / MySQL (docs/mysql.md, "The resource side"):
-- the store keeps the highest fence it accepted per resource and refuses
-- older ones in the same transaction as the write. test_mysql
-- resource_fence_and_skip_locked runs this file and checks what it left.

CREATE TABLE IF NOT EXISTS resource_fence (
  resource VARCHAR(190) NOT NULL PRIMARY KEY,
  fence BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS accounts (
  id INT NOT NULL PRIMARY KEY,
  balance BIGINT NOT NULL
) ENGINE=InnoDB;
INSERT INTO accounts VALUES (42, 1000) ON DUPLICATE KEY UPDATE balance = 1000;

-- The holder with fence 17 pays: the fence row is locked (FOR UPDATE reads
-- the latest committed row under READ COMMITTED and REPEATABLE READ alike,
-- and a writer with another fence waits here), raised only if 17 is not
-- older, and the write commits with it.
START TRANSACTION;
INSERT INTO resource_fence (resource, fence) VALUES ('payout:42', 0)
  ON DUPLICATE KEY UPDATE resource = resource;
SELECT fence INTO @stored FROM resource_fence WHERE resource = 'payout:42' FOR UPDATE;
UPDATE resource_fence SET fence = 17 WHERE resource = 'payout:42' AND fence <= 17;
UPDATE accounts SET balance = balance - 100 WHERE id = 42 AND @stored <= 17;
COMMIT;

-- A stale holder (fence 16, paused past its lease) comes back: the
-- conditional statement changes no row, and the application rolls back
-- instead of writing. In one statement, without the read:
INSERT INTO resource_fence (resource, fence) VALUES ('payout:42', 16)
  ON DUPLICATE KEY UPDATE fence = IF(VALUES(fence) >= fence, VALUES(fence), fence);
-- ROW_COUNT() is 0 here: fence 16 was refused.
SET @stale_accepted = ROW_COUNT();

-- The work queue that needs no distributed lock: each worker takes a job
-- no other worker has locked, and its transaction is the lease
-- (MariaDB 10.6+, MySQL 8.0+).
CREATE TABLE IF NOT EXISTS jobs (
  id INT NOT NULL PRIMARY KEY,
  state VARCHAR(16) NOT NULL,
  payload VARCHAR(64) NOT NULL
) ENGINE=InnoDB;
INSERT IGNORE INTO jobs VALUES (1, 'queued', 'a'), (2, 'queued', 'b'), (3, 'queued', 'c');
START TRANSACTION;
SELECT id INTO @job FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;
-- ... do the job ...
UPDATE jobs SET state = 'done' WHERE id = @job;
COMMIT;

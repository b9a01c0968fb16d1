-- Change numbers of the failover blocks (pgqueue.Failover), so that a
-- process applies the changes of a pair in the order they were made
-- however late they reach it. Written without a schema name: Migrate
-- sets the search path to the target schema.

-- The number of the last change of a block (a pair blocked, or a block
-- in force ended by a success) on the schema: each change takes the next
-- number by updating this one row, in the transaction that makes it, and
-- its notification carries the number. The row stays locked until that
-- transaction commits, so the numbers follow the order of the commits,
-- and a read of the blocks that reads this number in the same statement
-- reflects every change numbered up to it and none after. A process
-- ignores a notification or a read older than what it holds of the pair
-- (its own block notified after its own success cleared it).
CREATE TABLE failover_changes (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    last_change bigint  NOT NULL
);
INSERT INTO failover_changes (last_change) VALUES (0);

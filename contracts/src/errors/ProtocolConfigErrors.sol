// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IProtocolConfigTypes} from "../types/ProtocolConfigTypes.sol";

/// @title IProtocolConfigErrors
/// @notice The custom errors ProtocolConfig reverts with (verinfer.chain.artifacts decodes them
///         from the ABI by selector).
interface IProtocolConfigErrors {
    /// @notice A parameter set breaks a protocol rule; `reason` names the rule.
    error InvalidParams(string reason);
    /// @notice setParams would shorten `field` from `current` to `proposed`: receipts and
    ///         disputes that already exist read it (publicationDeadline: claims; drawPeriod:
    ///         running draws; challengeWindow: committed batches), so it may only grow.
    error ParamShortened(string field, uint256 current, uint256 proposed);
    /// @notice `drawPeriod` is shorter than `minDrawPeriod`, the time (at `blockTime` seconds a
    ///         block, with margin) until a challenge's seed block `drawDelayBlocks` after its
    ///         open block is mined: no committee could be drawn in time and every challenge,
    ///         frauds included, would end undrawn.
    error DrawPeriodTooShort(uint16 drawDelayBlocks, uint64 blockTime, uint256 minDrawPeriod, uint64 drawPeriod);
    /// @notice The entry is already approved.
    error AlreadyApproved(IProtocolConfigTypes.Kind kind, bytes32 id);
    /// @notice The entry is not currently approved.
    error NotApproved(IProtocolConfigTypes.Kind kind, bytes32 id);
    /// @notice The epoch number is already taken.
    error KeyEpochExists(uint64 epoch);
    /// @notice The epoch was never registered.
    error UnknownKeyEpoch(uint64 epoch);
    /// @notice The epoch is already retired.
    error KeyEpochAlreadyRetired(uint64 epoch, uint64 retiredAt);
    /// @notice Threshold/shard count out of range (need 1 <= t <= n).
    error InvalidThreshold(uint16 threshold, uint16 shardCount);
    /// @notice The epoch public key is empty.
    error EmptyPublicKey(uint64 epoch);
}
